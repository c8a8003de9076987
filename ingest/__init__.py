"""The feeds: trade and packet generators, CSV and pcap readers, and the Kafka producers.

:class:`IngestError` is the root of the package's errors (:mod:`ingest.errors`).  Names other
than the error root are imported on first use (:mod:`tidewatch.lazy`): ``import ingest`` does
not load Numba or the Kafka clients.
"""

from __future__ import annotations

from ingest.errors import IngestError
from tidewatch.lazy import lazy_exports

TYPE_CHECKING = False  # not typing's: importing typing costs more than this package
if TYPE_CHECKING:
    from ingest.packets_gen import PacketConfig, PacketGenerator
    from ingest.pcap import PcapError, read_pcap_chunks
    from ingest.producer import FeedProgress, FeedStats, KafkaFeed, ProgressMismatch, TransactionalFeed
    from ingest.trades_gen import TradeConfig, TradeGenerator

__all__ = [
    "FeedProgress",
    "FeedStats",
    "IngestError",
    "KafkaFeed",
    "PacketConfig",
    "PacketGenerator",
    "PcapError",
    "ProgressMismatch",
    "TradeConfig",
    "TradeGenerator",
    "TransactionalFeed",
    "read_pcap_chunks",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "FeedProgress": "ingest.producer",
        "FeedStats": "ingest.producer",
        "KafkaFeed": "ingest.producer",
        "PacketConfig": "ingest.packets_gen",
        "PacketGenerator": "ingest.packets_gen",
        "PcapError": "ingest.pcap",
        "ProgressMismatch": "ingest.producer",
        "TradeConfig": "ingest.trades_gen",
        "TradeGenerator": "ingest.trades_gen",
        "TransactionalFeed": "ingest.producer",
        "read_pcap_chunks": "ingest.pcap",
    },
)
