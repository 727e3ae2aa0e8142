"""How ``pretrained`` splits its measurements between processes: every rank walks the same keys and takes every
world_size-th; a filed measurement is read back, not made again."""

from posenc.experiments.pretrained.share import Share


def test_each_rank_takes_every_third_of_three_and_files_each_once(tmp_path):
    made = []

    def measure(name: str):
        return lambda: made.append(name) or {"name": name}

    shares = [Share(rank, 3) for rank in range(3)]
    taken = {rank: [] for rank in range(3)}
    for k in range(7):
        for rank, share in enumerate(shares):
            got = share.measured(tmp_path / f"m{k}.json", measure(f"m{k} by {rank}"))
            if got is not None:
                taken[rank].append(got["name"])
    assert taken == {0: ["m0 by 0", "m3 by 0", "m6 by 0"], 1: ["m1 by 1", "m4 by 1"], 2: ["m2 by 2", "m5 by 2"]}
    assert [s.seen for s in shares] == [7, 7, 7] and [s.made for s in shares] == [3, 2, 2]

    alone = Share()  # one process, after the others: reads every file back and makes none
    assert [alone.measured(tmp_path / f"m{k}.json", measure("again"))["name"] for k in range(7)] == [
        "m0 by 0", "m1 by 1", "m2 by 2", "m3 by 0", "m4 by 1", "m5 by 2", "m6 by 0"]
    assert (alone.seen, alone.made) == (7, 0) and len(made) == 7

