"""Each labelled counter keeps its own children (chatgate.metering.metrics.Labelled): one child per label
values, made once, never shared between two counters with the same label values."""

from __future__ import annotations

from chatgate.metering.metrics import Metrics


def test_a_counter_keeps_one_child_per_label_values_and_no_other_counters() -> None:
    metrics = Metrics(["deepseek-v4-flash"])
    first = metrics.rejections.labels("R5")
    assert metrics.rejections.labels("R5") is first
    assert metrics.repairs.labels("R5") is not first  # the same label values, another counter
    first.inc()
    metrics.repairs.labels("R5").inc(2)
    metrics.noticed("/v1/chat/completions", "n1")
    metrics.noticed("/v1/chat/completions", "n1")
    text = metrics.render().decode()
    assert 'chatgate_rejections_total{code="R5"} 1.0' in text
    assert 'chatgate_repairs_total{code="R5"} 2.0' in text
    assert 'chatgate_notices_total{code="n1",route="/v1/chat/completions"} 2.0' in text
