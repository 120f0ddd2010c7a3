"""orbitte.Engine.metrics(): what the engine counted, as a dict."""

import orbitte


def _op(m, path, peer, op):
    (row,) = [p for p in m["peers"] if p["path"] == path and p["peer"] == peer]
    (entry,) = [o for o in row["ops"] if o["op"] == op]
    return row, entry


def test_metrics_count_the_requests_bytes_and_outcomes_per_peer():
    target = orbitte.Engine("metrics-target", listen="127.0.0.1:0", path="tcp")
    initiator = orbitte.Engine("metrics-initiator", path="tcp")
    try:
        dst = target.alloc(1 << 20)
        target.register(dst)
        src = initiator.alloc(1 << 20)
        reg = initiator.register(src, remote=False)
        peer = initiator.connect(target.address)
        before = initiator.metrics()
        assert before["source_id"] == "metrics-initiator"
        assert all(o["requests"] == 0 for p in before["peers"] for o in p["ops"])

        initiator.transfer(peer, [orbitte.write(reg, peer.range(0), 65536),
                                  orbitte.write(reg, peer.range(0), 4096, remote_offset=65536),
                                  orbitte.read(reg, peer.range(0), 100)])
        m = initiator.metrics()
        row, write = _op(m, "tcp", "metrics-target", "write")
        _, read = _op(m, "tcp", "metrics-target", "read")
        assert (write["requests"], write["bytes"]) == (2, 65536 + 4096)
        assert (read["requests"], read["bytes"]) == (1, 100)
        assert write["outcomes"] == {"complete": 2, "failed": 0, "timed_out": 0, "cancelled": 0,
                                     "uncertain": 0}
        hist = write["latency"]
        assert hist["count"] == 2 and sum(hist["counts"]) == 2 and hist["sum_seconds"] > 0
        assert len(hist["counts"]) == 28
        assert row["rails_up"] >= 1 and row["rails_down"] == 0
        assert m["listener"] is None, "the initiator does not listen"

        served = target.metrics()
        _, w = _op(served, "tcp", "metrics-initiator", "write")
        _, r = _op(served, "tcp", "metrics-initiator", "read")
        assert (w["served_requests"], w["served_bytes"]) == (2, 65536 + 4096)
        assert (r["served_requests"], r["served_bytes"]) == (1, 100)
        assert served["listener"]["admitted"] >= 1
        assert served["registration"]["max_bytes"] > 0
    finally:
        initiator.close()
        target.close()
