"""The hooks an engine folder declares for `collect repro`, `collect fix` and the C++ harness build are complete:
each recipe names a runner half that defines `run`, and each engine the harness links also says what a build
without it carries (its source files left out, its key entries)."""
from __future__ import annotations

import ast
import json

from layerdiff.collector.engines import ENGINES
from layerdiff.collector.engines.featuremask import FeatureMaskModel
from layerdiff.collector.engines.reprorecipe import ReproRecipe
from layerdiff.collector.harness.build import HarnessLibrary


def test_every_repro_recipe_names_a_runner_half_that_defines_run():
    recipes = {name: engine.repro() for name, engine in ENGINES.items() if engine.repro is not None}
    assert recipes, "no engine writes repro bundles"
    for name, recipe in recipes.items():
        assert isinstance(recipe, ReproRecipe) and recipe.cuts_by in ("op", "name"), name
        tree = ast.parse(recipe.runner.read_text())
        functions = {node.name: len(node.args.args) for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert functions.get("run") == 4, f"{name}: {recipe.runner} defines no run(module, spec, config, here)"
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                    for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])}
        assert "layerdiff" not in imported, f"{name}: the runner half runs without layerdiff"


def test_an_engine_without_a_recipe_is_refused_with_its_reason_or_the_engines_that_have_one():
    refusing = [engine for engine in ENGINES.values() if engine.repro is None and engine.repro_refusal]
    assert refusing and all("\n" not in engine.repro_refusal for engine in refusing)


def test_every_engine_the_harness_links_gives_its_part_with_and_without_it():
    linked = {name: engine for name, engine in ENGINES.items() if engine.harness_spec is not None}
    assert linked
    for name, engine in linked.items():
        assert engine.harness_absent is not None, f"{name} declares harness_spec without harness_absent"
        part = engine.harness_absent("host", False, True)
        assert isinstance(part, HarnessLibrary) and part.source_prefix, name
        assert isinstance(json.loads(part.key_spec), dict) and isinstance(json.loads(part.key), dict), name


def test_a_feature_mask_engine_declares_its_masks():
    masking = {name: engine for name, engine in ENGINES.items() if engine.fix_mechanism == "feature-mask"}
    assert masking
    for name, engine in masking.items():
        assert engine.feature_mask is not None, name
        model = engine.feature_mask()
        assert isinstance(model, FeatureMaskModel) and model.high_mask("cpu") > 0 and model.describe(model.high_mask("cpu"))


def test_every_bisect_recipe_is_complete_and_engines_without_one_refuse_in_one_line():
    from layerdiff.collector.engines.bisectrecipe import BisectRecipe

    recipes = {name: engine.bisect() for name, engine in ENGINES.items() if engine.bisect is not None}
    assert len(recipes) >= 2, "fewer than two engines can bisect"
    for name, recipe in recipes.items():
        assert isinstance(recipe, BisectRecipe) and recipe.how and "\n" not in recipe.how, name
        assert not (recipe.in_process and recipe.keep_args), f"{name}: trials run in process or through a harness"
    assert len({recipe.name for recipe in recipes.values()}) == len(recipes), "two engines share a mechanism name"
    refusing = [engine for engine in ENGINES.values() if engine.bisect is None and engine.bisect_refusal]
    assert refusing and all("\n" not in engine.bisect_refusal for engine in refusing)


def test_every_program_recipe_builds_with_cmake_against_a_named_tree(tmp_path):
    from layerdiff.collector.engines.reprorecipe import ProgramRecipe
    from layerdiff.errors import UsageError

    recipes = {name: engine.repro_program() for name, engine in ENGINES.items() if engine.repro_program is not None}
    assert recipes, "no engine writes program bundles"
    for name, recipe in recipes.items():
        assert isinstance(recipe, ProgramRecipe) and recipe.one_op and "\n" not in recipe.one_op, name
        assert engine_free_of_repro_room(recipe), name
        try:
            recipe.source_tree(tmp_path)  # an empty folder is no source tree: one line says what to pass
        except UsageError as err:
            assert "--source-dir" in str(err) and str(tmp_path) in str(err), name
        else:
            raise AssertionError(f"{name}: an empty folder was taken for its source tree")
        assert any(str(tmp_path) in arg for arg in recipe.configure_args(tmp_path)), name


def engine_free_of_repro_room(recipe) -> bool:
    """The recipe's functions live in the engine's folder, not in collector/repro/."""
    return all(getattr(fn, "__module__", "").startswith("layerdiff.collector.engines.")
               for fn in (recipe.read_node, recipe.describe, recipe.program, recipe.readme, recipe.source_tree))
