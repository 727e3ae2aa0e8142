"""Each extension method by name is the rope_parameters dict transformers reads, and a methods list parses."""

import pytest

from posenc.extension.methods import METHODS, method_scaling, parse_methods


def test_each_method_is_its_transformers_dict():
    assert method_scaling("pi", 8, 64) == {"rope_type": "linear", "rope_theta": 10000.0, "factor": 8.0}
    assert method_scaling("ntk", 4, 64, base=500000) == {"rope_type": "ntk", "rope_theta": 500000.0, "factor": 4.0}
    for method in ("dynamic", "yarn"):
        assert method_scaling(method, 2.5, 128) == {"rope_type": method, "rope_theta": 10000.0, "factor": 2.5,
                                                    "original_max_position_embeddings": 128}
    assert method_scaling("llama3", 8, 8192) == {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                                 "original_max_position_embeddings": 8192, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0}
    numbers = method_scaling("yarn", 2, 64.0, base=10000)  # JSON and transformers' checks see float, float, int
    assert [type(numbers[k]) for k in ("factor", "rope_theta", "original_max_position_embeddings")] == [float, float,
                                                                                                      int]


def test_longrope_needs_its_searched_factors_and_an_unknown_method_is_named():
    with pytest.raises(ValueError, match=r"^method must be one of \['dynamic', 'llama3', 'ntk', 'pi', 'yarn'\], got 'longrope'"):
        method_scaling("longrope", 8, 64)
    with pytest.raises(ValueError, match=r"^method must be one of .*, got 'rerope'$"):
        method_scaling("rerope", 8, 64)


def test_a_methods_list_keeps_its_order_and_refuses_what_it_cannot_run():
    assert parse_methods("yarn, pi,,") == ("yarn", "pi")
    with pytest.raises(ValueError, match=r"^--methods names 'yarn' twice; give each once$"):
        parse_methods("yarn, pi,,yarn")
    assert parse_methods(["ntk", "pi"]) == ("ntk", "pi")
    assert METHODS == ("pi", "ntk", "dynamic", "yarn", "llama3", "longrope")
    with pytest.raises(ValueError, match=r"unknown methods \['llama3'\]; valid: pi, yarn"):
        parse_methods("llama3", ("pi", "yarn"))
    with pytest.raises(ValueError, match=r"^--methods names no method: give a comma list of pi, ntk, "):
        parse_methods(" , ")


def test_the_commands_branch_on_the_methods_traits():
    """What each command offers follows from a trait of the method, so a new method joins by its entry alone."""
    from posenc.experiments.extend.config import EXTEND_METHODS
    from posenc.experiments.pretrained.config import PretrainedConfig
    from posenc.extension.methods import BY_NAME, having

    assert having(lambda m: m.length_dependent) == ("dynamic", "longrope")  # no retrieval cache across lengths
    assert [m for m in METHODS if BY_NAME[m].fine_tunable] == ["pi", "ntk", "yarn", "llama3"]
    assert EXTEND_METHODS == ("pi", "ntk", "dynamic", "yarn", "longrope")  # llama3's bands are for 8k originals
    assert BY_NAME["pi"].rope_type == "linear" and all(BY_NAME[m].rope_type == m for m in METHODS if m != "pi")
    for refused in ("dynamic", "longrope", "none"):
        with pytest.raises(ValueError, match="--finetune-method"):
            PretrainedConfig.from_preset("smoke", finetune_method=refused)
