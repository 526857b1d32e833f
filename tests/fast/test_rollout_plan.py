"""How a rollout is staged, without any host: canary first, then batches."""
from fleetpatch.rollout import plan_stages


class H:
    def __init__(self, name, node_group=None, node_rank=None):
        self.name, self.node_group, self.node_rank = name, node_group, node_rank

    def __repr__(self):
        return self.name


HOSTS = [H(f"h{i}") for i in range(7)]


def names(stages):
    return [[h.name for h in s] for s in stages]


def test_default_canary_is_the_first_host_then_the_rest_at_once():
    stages, canary = plan_stages(HOSTS, None, None, None)
    assert canary and names(stages) == [["h0"], ["h1", "h2", "h3", "h4", "h5", "h6"]]


def test_canary_group_wins_and_batches_split_the_rest():
    stages, canary = plan_stages(HOSTS, ["h3", "h5"], None, 2)
    assert canary and names(stages) == [["h3", "h5"], ["h0", "h1"], ["h2", "h4"], ["h6"]]


def test_canary_zero_skips_the_canary_stage_even_with_a_group():
    stages, canary = plan_stages(HOSTS, ["h3"], 0, 3)
    assert not canary and names(stages) == [["h0", "h1", "h2"], ["h3", "h4", "h5"], ["h6"]]


def test_a_canary_group_outside_the_selection_is_no_canary():
    stages, canary = plan_stages(HOSTS[:3], ["h5"], None, None)
    assert not canary and names(stages) == [["h0", "h1", "h2"]]


def test_a_node_group_is_one_unit_in_the_canary_and_the_batches():
    """Its ranks stay together in one stage, in rank order, and count once towards --canary and --batch."""
    fleet = [H("b1", "kimi", 1), H("a1"), H("b0", "kimi", 0), H("a2"), H("a3"), H("a4")]
    stages, canary = plan_stages(fleet, None, None, 2)
    assert canary and names(stages) == [["b0", "b1"], ["a1", "a2"], ["a3", "a4"]]
    stages, _ = plan_stages(fleet, ["b1"], None, 3)   # the canary group names one rank: the whole group goes
    assert names(stages) == [["b0", "b1"], ["a1", "a2", "a3"], ["a4"]]
    stages, _ = plan_stages(fleet, None, 2, None)
    assert names(stages) == [["b0", "b1", "a1"], ["a2", "a3", "a4"]]


def test_a_failed_node_group_counts_once_against_the_failure_budget():
    """Its two failed ranks are one failure: with --max-failures 1 the rollout goes on past it."""
    from fleetpatch.errors import Status
    from fleetpatch.rollout import by_unit, rollout
    from fleetpatch.steps import HostResult
    fleet = [H("b0", "kimi", 0), H("b1", "kimi", 1), H("a1"), H("a2"), H("a3")]
    failing = {"b0", "b1"}

    def host_step(h):
        return HostResult(h.name, h.name not in failing, Status.VERIFIED if h.name not in failing else Status.TIMEOUT)

    def group_step(unit):
        return [host_step(h) for h in unit]

    planned, _ = plan_stages(fleet, None, 0, 1)
    results, stop, stages = rollout(fleet, by_unit(host_step, group_step), stages=planned, has_canary=False,
                                    parallel=1, max_failures=1)
    assert stages == [["b0", "b1"], ["a1"], ["a2"], ["a3"]] and stop.reason is None
    assert [results[n].details.get("node_group") for n in ("b0", "b1", "a1")] == ["kimi", "kimi", None]
    assert all(results[n].ok for n in ("a1", "a2", "a3"))

    failing.add("a1")   # a second unit fails: over the budget, the rest are not started
    results, stop, _ = rollout(fleet, by_unit(host_step, group_step), stages=planned, has_canary=False,
                               parallel=1, max_failures=1)
    assert "more than --max-failures 1: 2 units (a host, or a node group counted once) had failed" in stop.reason
    assert results["a2"].status == results["a3"].status == Status.SKIPPED


def test_an_unproven_canary_stops_the_rollout_unless_its_bake_proved_it():
    """issue 31: unproven is a failure, so the canary stops the rollout; a bake that proves it
    (an added line ran under traffic) lets the batches go on. An unproven host is baked."""
    from fleetpatch.errors import Status
    from fleetpatch.rollout import by_unit, rollout
    from fleetpatch.steps import HostResult
    fleet = [H("c0"), H("a1"), H("a2")]

    def host_step(h):
        return HostResult(h.name, h.name != "c0", Status.VERIFIED if h.name != "c0" else Status.UNPROVEN)

    planned, canary = plan_stages(fleet, None, 1, None)
    results, stop, _ = rollout(fleet, by_unit(host_step, None), stages=planned, has_canary=canary, parallel=1,
                               max_failures=0)
    assert "the canary failed (c0: unproven)" in stop.reason
    assert results["a1"].status == Status.SKIPPED

    baked = []

    def bake(h, result):   # what bake_host does with an unproven host whose traffic proved it
        baked.append((h.name, result.status))
        return HostResult(h.name, True, Status.VERIFIED) if result.status == Status.UNPROVEN else result

    results, stop, _ = rollout(fleet, by_unit(host_step, None), stages=planned, has_canary=canary, parallel=1,
                               max_failures=0, bake=bake)
    assert stop.reason is None and all(results[n].ok for n in ("c0", "a1", "a2")), (stop.reason, results)
    assert ("c0", Status.UNPROVEN) in baked


def test_the_stopped_line_names_hosts_not_started_only_when_there_are_some():
    """`stopped: interrupted (SIGHUP): …` after the last host had started: no "0 hosts not started"."""
    from fleetpatch.errors import Status
    from fleetpatch.rollout import Stop
    from fleetpatch.steps import HostResult
    stop = Stop()
    stop.set("interrupted (SIGHUP): no new host was started", interrupted=True)
    started = {"a": HostResult("a", False, Status.INTERRUPTED)}
    assert stop.describe(started) == "stopped: interrupted (SIGHUP): no new host was started"
    started["b"] = HostResult("b", False, Status.SKIPPED)
    assert stop.describe(started).endswith("; 1 host not started (skipped, untouched)")
