"""The dashboard's pages; each page module exposes ``render()`` (``summary`` holds what two pages share)."""
