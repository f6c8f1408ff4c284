"""The forms of the operator console's pages (run, re-run, resolve, restore): shapes only.

What each form collects goes to the same service as the API's endpoint; the
service decides, and its refusal comes back to the page as a message or an
inline error.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms

from .definition import definition_json_schema
from .models import Automation, Run

SIMPLE_TYPES = ("string", "integer", "number", "boolean")


class DefinitionEditor(forms.Textarea):
    """The definition's textarea, with a JSON code editor drawn over it that checks the text against
    the definition's JSON schema as you type (static/automations/definition_editor.js). The textarea
    stays the form field: without JavaScript it is what you edit."""

    template_name = "admin/automations/widgets/definition_editor.html"

    class Media:
        js = ["dist/jsoneditor.min.js", "automations/definition_editor.js"]
        css = {"all": ["dist/jsoneditor.min.css"]}

    def __init__(self, attrs=None):
        super().__init__(attrs={"rows": 30, "cols": 110, "style": "font-family: monospace", "spellcheck": "false",
                                **(attrs or {})})  # fmt: skip

    def get_context(self, name, value, attrs):
        context = super().get_context(name, value, attrs)
        context["widget"]["schema"] = editor_schema()
        context["widget"]["schema_id"] = f"{context['widget']['attrs'].get('id', name)}-schema"
        return context


def editor_schema() -> dict[str, Any]:
    """The definition schema for the editor's validator (Ajv, draft-07): the same keywords without
    the 2020-12 ``$schema`` and the ``$id`` it would try to resolve. Hints only: the save validates."""
    return {key: value for key, value in definition_json_schema().items() if key not in ("$schema", "$id")}


class PrettyJSONField(forms.JSONField):
    """JSON shown indented in a monospace textarea (Django's default is one compacted line)."""

    widget = forms.Textarea(
        attrs={"rows": 30, "cols": 110, "style": "font-family: monospace", "spellcheck": "false"}
    )

    def prepare_value(self, value):
        if isinstance(value, forms.fields.InvalidJSONInput):
            return value
        return json.dumps(value, indent=2, ensure_ascii=False, cls=self.encoder)


class RerunForm(forms.Form):
    from_step = forms.ChoiceField(
        required=False, label="Start from",
        help_text="Earlier steps' outputs are reused; they must have succeeded in this run.",
    )  # fmt: skip

    def __init__(self, *args, run: Run, **kwargs):
        super().__init__(*args, **kwargs)
        steps = [step["step_id"] for step in run.snapshot.get("plan", [])]
        self.fields["from_step"].choices = [("", "the first step (a full re-run)")] + [(s, s) for s in steps]


class ResolveForm(forms.Form):
    resolution = forms.ChoiceField(
        choices=[("succeeded", "The step did succeed: continue with the next step"),
                 ("retry", "Retry the step"), ("failed", "Fail the run")],
        widget=forms.RadioSelect,
    )  # fmt: skip
    reason = forms.CharField(max_length=1000, widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
                             help_text="Required: it goes into the audit trail.")  # fmt: skip
    output = PrettyJSONField(
        required=False, widget=forms.Textarea(attrs={"rows": 6, "cols": 80, "style": "font-family: monospace"}),
        help_text="For \"succeeded\": the step's output data (JSON), as later steps will see it.",
    )  # fmt: skip


def _input_field(name: str, prop: dict[str, Any], required: bool) -> forms.Field:
    kind = prop.get("type")
    common = {"label": name, "required": required, "help_text": prop.get("description", "")}
    if "enum" in prop and all(isinstance(v, str) for v in prop["enum"]):
        choices = [] if required else [("", "---------")]
        return forms.ChoiceField(choices=choices + [(v, v) for v in prop["enum"]], **common)
    if kind == "integer":
        return forms.IntegerField(**common)
    if kind == "number":
        return forms.FloatField(**common)
    if kind == "boolean":
        return forms.NullBooleanField(**{**common, "required": False})
    return forms.CharField(strip=False, **common)


class RunInputsForm(forms.Form):
    """One field per simple top-level input of the automation's input schema, plus JSON for the rest.

    Validation of the values is the dispatcher's (the same as ``POST /automations/{id}/run``):
    its located errors come back onto these fields.
    """

    inputs_json = forms.JSONField(
        required=False, label="More inputs (JSON)", initial=dict,
        widget=forms.Textarea(attrs={"rows": 6, "cols": 80, "style": "font-family: monospace"}),
        help_text="A JSON object merged under the fields above (for inputs that are objects or lists).",
    )  # fmt: skip

    def __init__(self, *args, automation: Automation, **kwargs):
        super().__init__(*args, **kwargs)
        schema = (automation.definition.get("inputs") or {}).get("schema") or {}
        required = set(schema.get("required") or ())
        self.input_names: list[str] = []
        for name, prop in (schema.get("properties") or {}).items():
            if (
                isinstance(prop, dict)
                and prop.get("type") in SIMPLE_TYPES
                and f"in_{name}" not in self.fields
            ):
                default_given = "default" in prop
                self.fields[f"in_{name}"] = _input_field(name, prop, name in required and not default_given)
                self.input_names.append(name)

    def clean_inputs_json(self):
        value = self.cleaned_data.get("inputs_json")
        if value in (None, ""):
            return {}
        if not isinstance(value, dict):
            raise forms.ValidationError("inputs are a JSON object")
        return value

    def inputs(self) -> dict[str, Any]:
        inputs = dict(self.cleaned_data.get("inputs_json") or {})
        for name in self.input_names:
            value = self.cleaned_data.get(f"in_{name}")
            if value is not None and value != "":
                inputs[name] = value
        return inputs

    def add_service_errors(self, errors: list[dict[str, Any]]) -> None:
        """Put the dispatcher's ``/inputs/<name>`` errors on their fields, the others on the form."""
        for error in errors:
            parts = str(error.get("path", "")).split("/")
            field = f"in_{parts[2]}" if len(parts) > 2 and parts[1] == "inputs" else None
            message = f"{error.get('message', '')} ({error.get('code', '')})"
            self.add_error(field if field in self.fields else None, message)
