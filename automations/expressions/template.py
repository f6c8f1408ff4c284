"""Templates (SPEC §4): the one sandboxed Jinja environment everything renders through.

Pure module, no Django. Templates are untrusted (people and LLMs write them), so on top of
Jinja's immutable sandbox this module: allows no globals, a curated list of filters and tests
and a short list of methods; rejects `_`-prefixed attributes, `str.format` and loader tags
before compiling; refuses operations whose result would pass the output cap before they
allocate (at compile time too: Jinja folds nothing that could grow); and stops a render that
runs past its CPU budget from hooks the sandbox calls on every attribute, item, call,
operator, output and loop iteration. Every failure leaves as `TemplateError` with a message
that is safe to show a user or an LLM.

The curated filters and tests live in `filters`; the caps, errors, budget and size-checked
value conversion that both share live in `limits`. This module is the public interface: import
from here.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple

from jinja2 import Template, meta, nodes, pass_context
from jinja2 import exceptions as jinja_errors
from jinja2.runtime import LoopContext, Macro, StrictUndefined, Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment, is_internal_attribute, modifies_known_mutable
from jinja2.utils import missing

from .filters import ALLOWED_FILTERS, ALLOWED_TESTS, FILTERS, TESTS
from .limits import (
    CURRENT_BUDGET,
    MAX_ALLOCATED_BYTES,
    MAX_INT_BITS,
    MAX_NESTING,
    MAX_OUTPUT_BYTES,
    MAX_SLUG_INPUT,
    MAX_SOURCE_BYTES,
    OUTPUT_LIMIT_MESSAGE,
    RENDER_BUDGET_SECONDS,
    WALL_BACKSTOP_SECONDS,
    Budget,
    TemplateError,
    TemplateLimitError,
    as_text,
    charge,
    check_text,
    is_int,
    json_copy,
    reserve,
    tick,
    to_json,
)

__all__ = [
    "ALLOWED_FILTERS",
    "ALLOWED_TESTS",
    "MAX_ALLOCATED_BYTES",
    "MAX_INT_BITS",
    "MAX_NESTING",
    "MAX_OUTPUT_BYTES",
    "MAX_SLUG_INPUT",
    "MAX_SOURCE_BYTES",
    "RENDER_BUDGET_SECONDS",
    "WALL_BACKSTOP_SECONDS",
    "TemplateError",
    "TemplateLimitError",
    "evaluate_predicate",
    "is_template",
    "iter_templates",
    "render",
    "render_value",
    "template_names",
    "validate_template",
]

logger = logging.getLogger(__name__)


def _forbidden(name: Any) -> TemplateError:
    return TemplateError(f"template uses a forbidden attribute {str(name)[:40]!r}")


# -- output and operators --------------------------------------------------------------------


def _output(value: Any) -> str:  # the environment's `finalize`: every `{{ }}` goes through it
    tick()
    return as_text(value)


def _size(value: Any, limit: int) -> int:
    if isinstance(value, str):
        if len(value) > limit:
            raise TemplateLimitError(OUTPUT_LIMIT_MESSAGE)
        return len(value)
    return json_copy(value, limit)[1]


def _kind(value: Any) -> str:  # a value's type in JSON words, for messages
    for kind, name in ((bool, "boolean"), (int | float, "number"), (str, "text"), (Mapping, "object")):
        if isinstance(value, kind):
            return name
    return "list" if isinstance(value, list | tuple) else "null" if value is None else "a non-JSON value"


def _check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse an operator whose result would be too large, before computing it."""
    if operator == "**" and is_int(left) and is_int(right) and right > 0 and abs(left) > 1:
        # a huge int power runs in C holding the GIL: nothing could stop it once started
        if right > MAX_INT_BITS or right * math.log2(abs(left)) > MAX_INT_BITS:
            raise TemplateLimitError("number would be too large")
    elif operator == "*":
        if is_int(left) and is_int(right):
            if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise TemplateLimitError("number would be too large")
            return
        sequence, count = (left, right) if is_int(right) else (right, left)
        if is_int(count) and count > 0 and isinstance(sequence, str | list | tuple):
            reserve(_size(sequence, MAX_OUTPUT_BYTES // count) * count)
    elif operator == "+" and isinstance(left, str | list | tuple) and isinstance(right, str | list | tuple):
        reserve(_size(left, MAX_OUTPUT_BYTES) + _size(right, MAX_OUTPUT_BYTES))


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d*))?(.)?", re.DOTALL)


def _percent_format(template: str, args: Any) -> str:
    """`'%.2f' % price`, with bounded widths and only strings and numbers as arguments."""
    values = args if isinstance(args, tuple) else (args,)
    if not all(value is None or isinstance(value, str | int | float) for value in values):
        raise TemplateError("the % operator only formats strings and numbers")
    estimate = len(template)
    for width, precision, conversion in _PERCENT_SPEC.findall(template):
        if conversion not in "sdifFeEgGxXoc%" or "*" in (width, precision):
            raise TemplateError("the % operator supports only plain conversions like %s, %d and %.2f")
        if len(width) > 3 or len(precision) > 3 or int(width or 0) > 100 or int(precision or 0) > 100:
            raise TemplateLimitError("format width and precision are limited to 100")
        estimate += 200
    for value in values:
        estimate += len(value) if isinstance(value, str) else 330 if isinstance(value, float) else 8
        if is_int(value):
            estimate += value.bit_length() // 3
    reserve(estimate)
    return template % args


# -- environment -----------------------------------------------------------------------------


@pass_context
def _tick_filter(_context: Any, _value: Any) -> bool:
    tick()
    return True


@pass_context
def _concat_filter(_context: Any, values: tuple) -> str:  # the `~` operator
    tick()
    parts = [as_text(value) for value in values]
    reserve(sum(map(len, parts)))
    return "".join(parts)


# Hooks the compiler wires in (see _prepare); a template cannot name them: not in ALLOWED_FILTERS.
_HOOKS = {"__tick": _tick_filter, "__concat": _concat_filter}

# Methods a template may call. Everything else callable (str.format, str.center, int.to_bytes,
# dict.update...) is refused: a whitelist, because a blacklist misses the next CVE.
_SAFE_METHODS: tuple[tuple[Any, frozenset[str]], ...] = (
    (
        str,
        frozenset(
            "capitalize casefold count endswith find isalnum isalpha isdigit islower isspace isupper lower"
            " lstrip partition removeprefix removesuffix rfind rpartition rsplit rstrip split splitlines"
            " startswith strip title upper".split()
        ),
    ),
    (Mapping, frozenset({"get", "items", "keys", "values"})),
    (list | tuple, frozenset({"count", "index"})),
    (LoopContext, frozenset({"changed", "cycle"})),
)


def _method_allowed(owner: Any, name: str) -> bool:
    for kind, names in _SAFE_METHODS:
        if isinstance(owner, kind):
            return name in names
    return False


class _Inputs(dict):
    """The run's ``inputs`` while a template renders, so that a missing one is named as an input."""

    __slots__ = ()


class _Undefined(StrictUndefined):
    __slots__ = ()

    @property
    def _undefined_message(self) -> str:
        if self._undefined_hint:
            return self._undefined_hint
        name = self._undefined_name
        if isinstance(self._undefined_obj, _Inputs) and isinstance(name, str):
            return (
                f"input {name[:64]!r} is not defined: the run was not given it and the automation's "
                "input schema has no default for it"
            )
        shown = repr(name[:64]) if isinstance(name, str) else str(name)[:40] if is_int(name) else ""
        if self._undefined_obj is missing:
            return f"undefined variable {shown}"
        return f"undefined {'attribute' if isinstance(name, str) else 'item'} {shown}".rstrip()


class _Environment(ImmutableSandboxedEnvironment):
    # Intercepting every arithmetic operator also keeps Jinja from folding it at compile time.
    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

    def __init__(self) -> None:
        super().__init__(
            undefined=_Undefined, finalize=_output, keep_trailing_newline=True, optimized=False, cache_size=0
        )
        self.globals.clear()
        self.filters = {**FILTERS, **_HOOKS}
        self.tests = dict(TESTS)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if attr.startswith("_") or is_internal_attribute(obj, attr) or modifies_known_mutable(obj, attr):
            return False
        return not callable(value) or _method_allowed(obj, attr)

    def wrap_str_format(self, value: Any) -> None:
        return None  # str.format is not wrapped but refused, by is_safe_attribute

    def getattr(self, obj: Any, attribute: str) -> Any:
        tick()
        if isinstance(obj, Mapping) and attribute in obj:  # data first: `order.items` is the key
            return obj[attribute]
        return self._attribute(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        tick()
        try:
            value = obj[argument]
        except (TypeError, LookupError):
            if isinstance(argument, str):
                return self._attribute(obj, argument)
            return self.undefined(obj=obj, name=argument)
        if isinstance(argument, slice):
            charge(value)
        return value

    def _attribute(self, obj: Any, name: str) -> Any:
        if name.startswith("_"):
            raise _forbidden(name)
        try:
            value = getattr(obj, name)
        except AttributeError:
            return self.undefined(obj=obj, name=name)
        if not self.is_safe_attribute(obj, name, value):
            raise _forbidden(name)
        return value

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        tick()
        if isinstance(obj, Undefined):
            obj._fail_with_undefined_error()
        if isinstance(obj, types.BuiltinMethodType | types.MethodType):
            allowed = _method_allowed(obj.__self__, obj.__name__)
        else:
            allowed = isinstance(obj, Macro | LoopContext)
        if not allowed:
            raise TemplateError("template calls something that is not a permitted function")
        result = context.call(obj, *args, **kwargs)
        if isinstance(getattr(obj, "__self__", None), str):  # str methods build new text
            charge(result, new_items=True)
        return result

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        tick()
        if operator == "%" and isinstance(left, str):
            return _percent_format(left, right)
        _check_binop(operator, left, right)
        try:
            return self.binop_table[operator](left, right)
        except TypeError:
            raise TemplateError(f"cannot apply {operator} to {_kind(left)} and {_kind(right)}") from None

    def concat(self, pieces: Any) -> str:  # buffers of macros and blocks
        pieces = list(pieces)
        reserve(sum(map(len, pieces)))
        return "".join(pieces)


_ENV = _Environment()

# -- compiling -------------------------------------------------------------------------------

_FORBIDDEN_TAGS = (
    nodes.Extends,
    nodes.Include,
    nodes.Import,
    nodes.FromImport,
    nodes.Block,
    nodes.NSRef,
    nodes.EvalContextModifier,
)
_RESERVED_NAMES = frozenset({"self", "super", "range", "lipsum", "cycler", "joiner", "namespace", "dict"})
# Not dict literals: `{'update': 1}.update` is that key, not the method.
_LITERAL_SAMPLES: dict[type, Any] = {nodes.List: [], nodes.Tuple: ()}


def _check_attribute(target: nodes.Node, attr: str) -> None:
    if attr.startswith("_"):
        raise _forbidden(attr)
    sample = _fold(target)
    if sample is missing:
        sample = _LITERAL_SAMPLES.get(type(target), missing)
    if sample is not missing:  # a literal: the attribute can be judged now
        value = getattr(sample, attr, missing)
        if value is not missing and not _ENV.is_safe_attribute(sample, attr, value):
            raise _forbidden(attr)


def _fold(node: nodes.Node, depth: int = 0) -> Any:
    """The value of literal arithmetic (`'a' * 10**9`), computed under the render-time guards,
    so that save-time validation already refuses literal bombs; `missing` if not literal."""
    if isinstance(node, nodes.Const):
        return node.value
    if isinstance(node, nodes.List | nodes.Tuple) and depth < MAX_NESTING:
        items = [_fold(item, depth + 1) for item in node.items]
        if missing not in items:
            return items if isinstance(node, nodes.List) else tuple(items)
    if isinstance(node, nodes.BinExpr) and node.operator in _ENV.binop_table and depth < MAX_NESTING:
        left, right = _fold(node.left, depth + 1), _fold(node.right, depth + 1)
        if left is not missing and right is not missing:
            try:
                return _ENV.call_binop(None, node.operator, left, right)
            except TemplateError:
                raise
            except Exception:  # 1/0, 'a' - 1...: left for render time to report
                return missing
    return missing


def _check_node(node: nodes.Node) -> None:
    if isinstance(node, _FORBIDDEN_TAGS):
        raise TemplateError(
            "template uses a tag that is not available (extends/include/import/block/namespace)"
        )
    if isinstance(node, nodes.Filter) and node.name not in ALLOWED_FILTERS:
        raise TemplateError(f"filter {node.name[:40]!r} is not allowed")
    if isinstance(node, nodes.Test) and node.name not in ALLOWED_TESTS:
        raise TemplateError(f"test {node.name[:40]!r} is not allowed")
    if isinstance(node, nodes.Name) and (node.name.startswith("__") or node.name in _RESERVED_NAMES):
        raise TemplateError(f"name {node.name[:40]!r} is not available in templates")
    if isinstance(node, nodes.Getattr):
        _check_attribute(node.node, node.attr)
    if (
        isinstance(node, nodes.Getitem)
        and isinstance(node.arg, nodes.Const)
        and isinstance(node.arg.value, str)
    ):
        _check_attribute(node.node, node.arg.value)
    if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Getattr):
        if node.node.attr in ("format", "format_map"):
            raise _forbidden(node.node.attr)


def _hook(name: str, value: nodes.Expr, lineno: int) -> nodes.Filter:
    return nodes.Filter(value, name, [], [], None, None, lineno=lineno)


def _tick_hook(lineno: int) -> nodes.Filter:
    return _hook("__tick", nodes.Const(None, lineno=lineno), lineno)


def _prepare(ast: nodes.Template) -> None:
    """Check every node, then route `~` and loop iterations through the environment's hooks.

    Iterative, so a pathologically deep tree fails on the depth limit, not the stack.
    """
    stack: list[tuple[nodes.Node, int]] = [(ast, 0)]
    operands: set[int] = set()  # operators inside an operator already folded
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            raise TemplateLimitError("template is nested too deeply")
        _check_node(node)
        if isinstance(node, nodes.BinExpr):
            if id(node) not in operands:
                _fold(node)
            operands.update((id(node.left), id(node.right)))
        for field, value in node.iter_fields():
            children = value if isinstance(value, list) else [value]
            for index, child in enumerate(children):
                if not isinstance(child, nodes.Node):
                    continue
                stack.append((child, depth + 1))
                if isinstance(child, nodes.Concat):  # shares its operand list with the hook
                    hook = _hook(
                        "__concat", nodes.Tuple(child.nodes, "load", lineno=child.lineno), child.lineno
                    )
                    if value is children:
                        children[index] = hook
                    else:
                        setattr(node, field, hook)
        if isinstance(node, nodes.For):  # every iteration ticks, even an empty or filtered one
            node.body.insert(0, nodes.ExprStmt(_tick_hook(node.lineno), lineno=node.lineno))
            if node.test is not None:
                node.test = nodes.And(_tick_hook(node.lineno), node.test, lineno=node.lineno)


class _Compiled(NamedTuple):
    template: Template
    native: bool  # exactly one `{{ expr }}`: renders to the expression's own value
    names: frozenset[str]  # the top-level names the template reads


@contextmanager
def _guard(doing: str, seconds: float) -> Iterator[None]:
    """Run under a fresh budget and turn every failure into a safe TemplateError."""
    token = CURRENT_BUDGET.set(Budget(doing, seconds))
    try:
        yield
    except TemplateError:
        raise
    except jinja_errors.TemplateSyntaxError as exc:
        raise TemplateError(f"template syntax error on line {exc.lineno}: {str(exc.message)[:200]}") from exc
    except jinja_errors.UndefinedError as exc:
        raise TemplateError(str(exc)[:200]) from exc
    except jinja_errors.SecurityError as exc:
        raise TemplateError("template uses a forbidden operation") from exc
    except (RecursionError, SyntaxError) as exc:  # SyntaxError: Python's own nesting limits
        message = "template is nested too deeply" if doing == "parse" else "template recursion is too deep"
        raise TemplateLimitError(message) from exc
    except MemoryError as exc:
        raise TemplateLimitError("template ran out of memory") from exc
    except ZeroDivisionError as exc:
        raise TemplateError("template divides by zero") from exc
    except OverflowError as exc:
        raise TemplateLimitError("a number in the template is too large") from exc
    except Exception as exc:
        logger.debug("template %s failed", doing, exc_info=True)
        if doing == "parse":
            raise TemplateError("template could not be parsed") from exc
        kind = "value" if isinstance(exc, ValueError) else "operation"
        raise TemplateError(f"template failed to render: invalid {kind} for the given data") from exc
    finally:
        CURRENT_BUDGET.reset(token)


@functools.lru_cache(maxsize=512)
def _compile(source: str) -> _Compiled:
    if len(source) > MAX_SOURCE_BYTES:
        raise TemplateLimitError("template is larger than 8 KB")
    try:
        encoded = source.encode("utf-8")
    except UnicodeEncodeError:
        raise TemplateError("template is not valid Unicode text") from None
    if len(encoded) > MAX_SOURCE_BYTES:
        raise TemplateLimitError("template is larger than 8 KB")
    if "\x00" in source:
        raise TemplateError("template contains a NUL character")
    with _guard("parse", 10 * RENDER_BUDGET_SECONDS):  # parsing itself cannot loop
        ast = _ENV.parse(source)
        _prepare(ast)
        # Name analysis generates code, and code generation folds constants: it runs here, in
        # the sandboxed environment and under this budget, never in a plain environment.
        names = frozenset(meta.find_undeclared_variables(ast))
        body = ast.body
        output = body[0] if len(body) == 1 and isinstance(body[0], nodes.Output) else None
        expression = output.nodes[0] if output is not None and len(output.nodes) == 1 else None
        if isinstance(expression, nodes.TemplateData):
            expression = None
        native = expression is not None
        if expression is not None:  # evaluate as `{% set result = expr %}` and read the variable back
            ast = nodes.Template([nodes.Assign(nodes.Name("result", "store"), expression)], lineno=1)
            ast.set_lineno(1)
        ast.set_environment(_ENV)
        return _Compiled(_ENV.from_string(ast), native, names)


# -- public interface ------------------------------------------------------------------------


def is_template(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value or "{#" in value)


def validate_template(source: str) -> None:
    """Save-time check: size, syntax, filters, tests, attributes; compiles (and caches) it."""
    if not isinstance(source, str):
        raise TemplateError("template must be text")
    _compile(source)


def template_names(source: str) -> frozenset[str]:
    """The top-level names a template reads (compiled, and so checked, in the sandbox)."""
    if not isinstance(source, str):
        raise TemplateError("template must be text")
    return _compile(source).names


def render(source: str, context: Mapping[str, Any]) -> Any:
    """Render one string. Exactly one `{{ expr }}` gives the value itself; anything else is text."""
    if not isinstance(source, str):
        raise TemplateError("template must be text")
    if not is_template(source):
        return source
    compiled = _compile(source)
    with _guard("render", RENDER_BUDGET_SECONDS):
        variables = dict(context)
        if type(variables.get("inputs")) is dict:
            variables["inputs"] = _Inputs(variables["inputs"])
        ctx = compiled.template.new_context(variables)
        pieces = compiled.template.root_render_func(ctx)
        if compiled.native:
            for _ in pieces:
                pass
            return to_json(ctx.vars["result"])
        out, size = [], 0
        for piece in pieces:
            size += len(piece)
            if size > MAX_OUTPUT_BYTES:
                raise TemplateLimitError(OUTPUT_LIMIT_MESSAGE)
            out.append(piece)
        text = "".join(out)
        if check_text(text) > MAX_OUTPUT_BYTES:
            raise TemplateLimitError(OUTPUT_LIMIT_MESSAGE)
        return text


def render_value(value: Any, context: Mapping[str, Any]) -> Any:
    """Render every string in a JSON-like structure; keys are left as they are."""

    def walk(item: Any, depth: int) -> Any:
        if isinstance(item, str):
            return render(item, context)
        if depth > MAX_NESTING:
            raise TemplateLimitError("value is nested too deeply")
        if isinstance(item, Mapping):
            return {key: walk(child, depth + 1) for key, child in item.items()}
        if isinstance(item, list | tuple):
            return [walk(child, depth + 1) for child in item]
        return item

    return walk(value, 0)


_FALSE_TEXT = frozenset({"", "false", "0"})


def evaluate_predicate(source: str, context: Mapping[str, Any]) -> bool:
    """A `when`: the rendered value's truthiness; text "false", "0" and "" are false."""
    value = render(source, context)
    if isinstance(value, str):
        return value.strip().lower() not in _FALSE_TEXT
    return bool(value)


def _pointer_token(key: Any) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")  # RFC 6901


def iter_templates(value: Any, pointer: str = "") -> Iterator[tuple[str, str]]:
    """(JSON pointer, template) for every templated string in a JSON structure, in order."""
    stack: list[tuple[str, Any]] = [(pointer, value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if is_template(item):
                yield path, item
        elif isinstance(item, Mapping):
            stack.extend(reversed([(f"{path}/{_pointer_token(key)}", child) for key, child in item.items()]))
        elif isinstance(item, list | tuple):
            stack.extend(reversed([(f"{path}/{index}", child) for index, child in enumerate(item)]))
