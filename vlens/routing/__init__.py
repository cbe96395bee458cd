"""Mixture-of-experts routing statistics by token region (docs/moe.md).

    stats = routing_statistics(model, batches)       # batches: VLMInputs, e.g. model.prepare(...)
    stats.share("image")                               # [n_moe_layers, n_experts]
    stats.plot().show(); stats.save("out/")
"""

from vlens.routing.statistics import REGIONS, RoutingStatistics, routing_statistics

__all__ = ["REGIONS", "RoutingStatistics", "routing_statistics"]
