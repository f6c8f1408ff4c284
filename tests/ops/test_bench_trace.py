"""``bench --http --trace``: stamps from several processes joined into one fire's segments."""

from __future__ import annotations

import json

from bench import trace
from bench.http_bench import _traced
from ops.management.commands.up import build_specs


def _write(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_stamps_of_the_web_and_the_worker_join_the_client_key_through_the_run(tmp_path):
    _write(
        tmp_path / "1.jsonl",
        [["k1", "web.view", 10.000], ["k1", "run", "r1"], ["r1", "db.committed", 10.004]],
    )
    _write(tmp_path / "2.jsonl", [["r1", "worker.received", 10.006], ["r1", "worker.received", 10.009],
                                  ["k2", "web.view", 20.0]])  # fmt: skip
    (tmp_path / "2.jsonl").write_text((tmp_path / "2.jsonl").read_text() + '["cut by a kill')

    stamps = trace.load(tmp_path)

    assert stamps["k1"] == {"web.view": 10.0, "db.committed": 10.004, "worker.received": 10.006, "run": "r1"}
    assert stamps["k2"] == {"web.view": 20.0}
    assert "r1" not in stamps


def test_segments_are_the_median_of_each_pair_stamped_in_a_fire():
    fires = [{"client.send": 0.0, "web.asgi": 0.001 * i, "client.seen": 0.010 * i} for i in (1, 2, 3)]
    fires.append({"client.send": 0.0, "client.seen": 0.5})  # web stamps missing: not in that segment

    rows = {pair: (p50, samples) for pair, _, p50, samples in trace.segments(fires)}

    assert rows["client.send → web.asgi"] == (2.0, 3)
    assert rows["client.send → client.seen"][1] == 4
    assert "web.asgi → web.wsgi" not in rows


def test_the_traced_topology_is_ups_with_the_hooks_added():
    specs = {spec.name: spec for spec in build_specs(host="127.0.0.1", port=1, concurrency=dict.fromkeys(
        ("default", "automations_fast", "automations_medium", "automations_long"), 1), web_workers=1)}  # fmt: skip
    web, worker = _traced(specs["web"]), _traced(specs["worker-fast"])

    assert "ops.asgi:application" in specs["web"].argv, (
        "the traced web app wraps up's; update bench/trace_asgi.py"
    )
    assert web.argv == [
        a if a != "ops.asgi:application" else "bench.trace_asgi:application" for a in specs["web"].argv
    ]
    assert worker.argv == [*specs["worker-fast"].argv, "--include", "bench.trace_worker"]
    assert _traced(specs["beat"]) == specs["beat"]
