"""The kernel ledger: a transition seen by several sources is counted once, none is lost."""
from exporter.correlate.ledger import KernelLedger
from exporter.events import Direction, EventsLost, Resource, Result, Transition


def tx(source, direction, end, unit=1, start=None, result=Result.SUCCESS):
    return Transition(source, Resource.CPU, unit, direction, result, end=end, start=start)


OFF, ON = Direction.OFFLINE, Direction.ONLINE


def test_same_transition_from_three_sources_counts_once_in_any_order():
    led = KernelLedger()
    seq = [tx("uevent", OFF, 1.02), tx("bpf", OFF, 1.0, start=0.98), tx("sysfs", OFF, 1.05),
           tx("bpf", ON, 2.0, start=1.99), tx("sysfs", ON, 2.1), tx("uevent", ON, 2.01)]
    new = [led.handle(t) for t in seq]
    assert new == [True, False, False, True, False, False]
    assert led.transitions[(Resource.CPU, OFF, Result.SUCCESS)] == 1
    assert led.transitions[(Resource.CPU, ON, Result.SUCCESS)] == 1
    assert led.events == {"uevent": 2, "bpf": 2, "sysfs": 2}


def test_interleaved_flaps_are_not_merged():
    # BPF delivers two full cycles before the uevents of the first arrive.
    led = KernelLedger()
    for t in [tx("bpf", OFF, 1, start=0.9), tx("bpf", ON, 2, start=1.9),
              tx("bpf", OFF, 3, start=2.9), tx("bpf", ON, 4, start=3.9),
              tx("uevent", OFF, 1.1), tx("uevent", ON, 2.1), tx("uevent", OFF, 3.1),
              tx("uevent", ON, 4.1)]:
        led.handle(t)
    assert led.transitions[(Resource.CPU, OFF, Result.SUCCESS)] == 2
    assert led.transitions[(Resource.CPU, ON, Result.SUCCESS)] == 2


def test_a_transition_one_source_lost_is_still_counted():
    led = KernelLedger()
    led.handle(tx("bpf", OFF, 1, start=0.9))
    led.handle(EventsLost("bpf", 1, 2.5))  # the ring buffer dropped the next record
    led.handle(tx("uevent", OFF, 1.1))
    assert led.handle(tx("uevent", OFF, 3.1)) is True  # second cycle only the uevent saw
    assert led.transitions[(Resource.CPU, OFF, Result.SUCCESS)] == 2
    assert led.lost["bpf"] == 1


def test_every_bpf_duration_is_observed_once():
    led = KernelLedger()
    led.handle(tx("uevent", OFF, 1.1))
    led.handle(tx("bpf", OFF, 1.0, start=0.98))  # duplicate for counting, but has a duration
    h = led.durations[(Resource.CPU, OFF)]
    assert h.n == 1 and abs(h.total - 0.02) < 1e-9


def test_failures_counted_apart_from_successes():
    led = KernelLedger()
    led.handle(tx("bpf", OFF, 1, start=0.99, result=Result.FAILED))
    led.handle(tx("bpf", OFF, 2, start=1.98))
    led.handle(tx("uevent", OFF, 2.01))
    assert led.transitions[(Resource.CPU, OFF, Result.FAILED)] == 1
    assert led.transitions[(Resource.CPU, OFF, Result.SUCCESS)] == 1


def test_units_are_independent():
    led = KernelLedger()
    assert led.handle(tx("uevent", OFF, 1, unit=1))
    assert led.handle(tx("uevent", OFF, 1, unit=2))
    assert led.transitions[(Resource.CPU, OFF, Result.SUCCESS)] == 2


def test_correlator_keeps_the_bpf_record_when_the_uevent_won_the_race():
    from exporter.clock import FakeClock
    from exporter.correlate.correlator import Correlator
    from testkit.correlator import config as correlator_config

    clock = FakeClock(100.0)
    ledger = KernelLedger()
    c = Correlator(correlator_config(), clock, ledger=ledger)
    c.handle(tx("uevent", OFF, 100.030))
    c.handle(tx("bpf", OFF, 100.025, start=100.005))
    (ep,) = c.open_episodes()
    assert [(t.source, t.start) for t in ep.transitions] == [("bpf", 100.005)]
    assert ep.opened == 100.005
    assert ledger.transitions[(Resource.CPU, OFF, Result.SUCCESS)] == 1
