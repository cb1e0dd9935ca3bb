"""Issue 27, schema conformance: forced tool calls over the kit's corpus of JSON-schema shapes, streamed and not.

Against a scripted loopback server (tests/quality_server.py) that answers every case validly, no case raises a
false alarm; against one that breaks a shape's arguments, the failure names the schema feature involved.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from kimi_deploy.check import CheckOptions, run_checks
from kimi_deploy.check.quality import conformance, corpus, schema
from kimi_deploy.check.check_ids import select
from quality_server import QualityServer


def test_every_shape_is_a_valid_2020_12_schema_and_its_example_validates():
    features = set()
    for s in corpus.SHAPES:
        jsonschema.Draft202012Validator.check_schema(s.schema)
        assert schema.violation(s.example, s.schema) is None, s.name
        features.update(s.features)
    # the features the issue names are all in the corpus
    assert {"$defs", "$ref", "anyOf", "oneOf", "enum", "const", "additionalProperties", "minimum", "maximum",
            "format", "nullable", "nested objects", "nested arrays", "pattern"} <= features


@pytest.mark.parametrize("name, args, feature", [
    ("defs_ref", {"ship_to": {"street": "a", "city": "b", "zip": "123"},
                  "bill_to": {"street": "a", "city": "b", "zip": "12345"}}, "$ref > pattern (^[0-9]{5}$)"),
    ("defs_ref", {"ship_to": {"street": "a", "city": "b", "zip": "12345", "x": 1},
                  "bill_to": {"street": "a", "city": "b", "zip": "12345"}}, "$ref > additionalProperties"),
    ("recursive_ref", {"tree": {"name": "a", "children": [{"name": "b", "children": [{"nam": "c"}]}]}},
     "$ref > required"),
    ("any_of", {"target": 0, "label": "x"}, "anyOf > minimum (1)"),
    ("one_of", {"action": {"kind": "jump"}}, "oneOf"),
    ("enum_const", {"unit": "kelvin", "version": 2, "mode": "fast"}, "enum"),
    ("enum_const", {"unit": "celsius", "version": 3, "mode": "fast"}, "const (2)"),
    ("closed_nested", {"user": {"name": "a", "prefs": {"theme": "d", "beta": True, "x": 1}}},
     "additionalProperties"),
    ("ranges", {"count": 11, "ratio": 0.3, "step": 1.75}, "maximum (10)"),
    ("ranges", {"count": 2, "ratio": 1, "step": 1.75}, "exclusiveMaximum (1)"),
    ("ranges", {"count": 2, "ratio": 0.5, "step": 0.3}, "multipleOf (0.25)"),
    ("formats", {**corpus.shape("formats").example, "email": "not-an-address"}, "format (email)"),
    ("formats", {**corpus.shape("formats").example, "at": "2026-12-02 03:04"}, "format (date-time)"),
    ("formats", {**corpus.shape("formats").example, "ref": "nope"}, "format (uuid)"),
    ("nullable", {"parent": 3, "limit": None, "note": None}, "type"),
    ("prefix_items", {"point": [1, 2, "x", 4]}, "items"),
    ("dependent_required", {"amount": 1, "card": "4111"}, "dependentRequired"),
    ("no_parameters", {"x": 1}, "additionalProperties"),
])
def test_a_violation_names_the_schema_feature(name, args, feature):
    found = schema.violation(args, corpus.shape(name).schema)
    assert found is not None and found[0].startswith(feature), found


def test_the_tier_is_off_by_default_and_on_when_asked():
    assert not any(i.startswith("quality.") for i in select())
    everything = select(quality=True)
    assert everything[-3:] == ["quality.accuracy", "quality.reasoning", "quality.certify"] and set(conformance.check_ids()) <= set(everything)
    assert [i for i in everything if not i.startswith("quality.")] == select()
    assert select(["quality.schema"]) == conformance.check_ids()
    assert len(conformance.check_ids()) == 4 * len(corpus.SHAPES)


def _run(url: str, only: str = "quality.schema.*"):
    return run_checks(CheckOptions(base_url=url, only=[only], deadline=120))


def test_no_false_alarm_when_the_server_answers_every_shape_validly():
    with QualityServer() as server:
        report = _run(server.url)
    assert len(report.results) == 4 * len(corpus.SHAPES)
    bad = [(r.id, r.kind, r.detail) for r in report.results if r.status != "pass"]
    assert not bad
    assert int(report.exit_code) == 0
    # both choices and both modes were really sent
    sent = server.requests
    assert sum(bool(b.get("stream")) for b in sent) == sum(not b.get("stream") for b in sent) == 2 * len(corpus.SHAPES)
    assert {json.dumps(b["tool_choice"]) for b in sent} >= {'"required"', json.dumps(
        {"type": "function", "function": {"name": "shape_formats"}})}


def test_a_broken_shape_fails_with_the_feature_streamed_and_not():
    def zip_cut(args):
        return {**args, "ship_to": {**args["ship_to"], "zip": "123"}}

    def bad_email(args):
        return {**args, "email": "ops-at-example.com"}

    with QualityServer(mutate={"shape_defs_ref": zip_cut, "shape_formats": bad_email}) as server:
        report = _run(server.url)
    failed = {r.id: r for r in report.results if r.status == "fail"}
    assert set(failed) == {f"quality.schema.{n}.{c}.{m}" for n in ("defs_ref", "formats")
                           for c in ("required", "named") for m in ("nonstream", "stream")}
    for r in failed.values():
        assert r.kind == "schema_violation" and r.fix
    assert failed["quality.schema.defs_ref.named.stream"].detail.startswith(
        "schema feature $ref > pattern (^[0-9]{5}$) (shape defs_ref)")
    assert "format (email)" in failed["quality.schema.formats.required.nonstream"].detail
    assert int(report.exit_code) == 1
