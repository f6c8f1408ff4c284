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


def test_the_slowest_fires_are_listed_stage_by_stage_with_the_typical_step_beside_each():
    fast = {"client.send": 0.0, "web.asgi": 0.001, "client.response": 0.004, "client.seen": 0.010}
    slow = {"client.send": 1.0, "web.asgi": 1.001, "client.response": 1.034, "client.seen": 1.040}
    fires = [fast, dict(fast), slow, {"client.send": 2.0}]  # the last never seen: left out

    lines = trace.slowest(fires, 1)

    assert lines[0].startswith("3 traced fires: send → seen p50 10.00 ms")
    assert lines[1].strip().startswith("40.00 ms  sent 00:00:01.000 UTC")
    assert "web.asgi → client.response  <<" in lines[3]  # 33 ms against a typical 3 ms
    assert "<<" not in lines[2]  # send → asgi took its usual 1 ms
    assert len(lines) == 5


def test_segments_keep_the_traces_for_the_slowest_listing(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    fires = [{"client.send": 0.0, "client.seen": 0.010}]

    trace.segments(fires)

    assert json.loads((tmp_path / trace.DIR_NAME / trace.TRACES_FILE).read_text()) == fires


def test_gc_pauses_logged_by_the_traced_processes_are_listed_under_the_fires_they_overlap(tmp_path):
    (tmp_path / "gc-7.log").write_text("1.010000 3.500 2 12\n5.000000 1.000 1 0\ncut")
    fires = [{"client.send": 1.0, "client.seen": 1.040}, {"client.send": 2.0, "client.seen": 2.010}]

    pauses = trace.gc_pauses(tmp_path)
    lines = trace.slowest(fires, 2, pauses)

    assert pauses == [(1.01, 3.5, 2, "7"), (5.0, 1.0, 1, "7")]
    assert [line.strip() for line in lines if "GC" in line] == [
        "GC: generation 2 in pid 7, 3.50 ms, at +10.0 ms"
    ]


def test_a_long_gc_pause_is_logged_before_the_trace_directory_exists(tmp_path, settings):
    settings.DATA_DIR = tmp_path / "fresh-clone-var"  # a first traced run: nothing made yet
    trace._gc_started[:] = [1_000.0]

    trace._gc_callback("stop", {"generation": 2, "collected": 7})

    [(began, ms, generation, _pid)] = trace.gc_pauses(trace.trace_dir())
    assert (began, generation) == (1_000.0, 2)
    assert ms > 0
