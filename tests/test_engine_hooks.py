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
