"""Timed contenders for ``kernels.dispatch`` tests: each 'runs' for a given number of milliseconds on the
``clock`` fixture's clock, and counts its calls."""


def counted(delays: dict[str, float]):
    """Contenders that count their calls; each 'runs' for its given number of milliseconds (by the clock)."""
    calls = {name: 0 for name in delays}
    clock = {"now": 0.0}

    def contender(name):
        def run():
            calls[name] += 1
            clock["now"] += delays[name] / 1e3
        return run

    return {name: contender(name) for name in delays}, calls, clock


def make(clock, delays):
    """(contenders that advance ``clock`` by their delays, their call counts)."""
    contenders, calls, own = counted(delays)

    def ticking(run):
        def timed():
            before = own["now"]
            run()
            clock["now"] += own["now"] - before
        return timed

    return {name: ticking(run) for name, run in contenders.items()}, calls
