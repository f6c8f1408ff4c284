"""input_mapping semantics (pure: no database)."""

from __future__ import annotations

import pytest

from triggers.input_mapping import MappingError, map_inputs, validate_mapping


def test_one_match_is_the_value_several_are_a_list_none_leaves_the_input_out():
    document = {"ref": "main", "items": [{"id": 1}, {"id": 2}], "head": {"sha": None}}

    inputs = map_inputs(
        {
            "branch": "$.ref",
            "ids": "$.items[*].id",
            "first": "$.items[0]",
            "sha": "$.head.sha",
            "gone": "$.nope",
        },
        document,
    )

    assert inputs == {"branch": "main", "ids": [1, 2], "first": {"id": 1}, "sha": None}


def test_the_whole_document_and_descendants_can_be_mapped():
    document = {"a": {"x": 1}, "b": [{"x": 2}]}

    assert map_inputs({"all": "$", "xs": "$..x"}, document) == {"all": document, "xs": [1, 2]}


@pytest.mark.parametrize("expression", ["ref", "$.[", "$.a[?(@.b > 1)]", "$" + ".a" * 200, 5])
def test_expressions_that_are_not_basic_jsonpath_are_refused(expression):
    assert validate_mapping({"x": expression})
    with pytest.raises(MappingError):
        map_inputs({"x": expression}, {"a": 1})


def test_a_valid_mapping_has_no_problems():
    assert validate_mapping({"branch": "$.ref", "ids": "$.items[*].id"}) == []
    assert validate_mapping(None) == []
    assert validate_mapping(["$.a"]) == [("", "input_mapping must be an object")]
