"""Jinja2 rendering in a sandbox, with one-line errors that say where.

Templates come from playbooks people share, so they render in Jinja2's
immutable sandbox with ``StrictUndefined``: a typo'd variable is an error,
never an empty string spliced into ``server_args.py``. The file reading is
injected (``lookup``) so this module stays pure; the shell layer supplies it.

Rendering has a budget, the deterministic stand-in for a time limit (core
does no I/O and keeps no clocks; nested loops once rendered for minutes):
each render (one string, one template file, one ``when:``) may take at most
``MAX_TEMPLATE_STEPS`` loop iterations plus calls (every ``{% for %}``'s
iterable is counted as it is walked; every call goes through the sandbox's
``call``) and produce at most ``MAX_TEMPLATE_OUTPUT`` characters; ``*`` and
``**`` may not build a value beyond that size. The budget's steps render in
well under ``TEMPLATE_TIME_LIMIT`` seconds on a slow machine. Over budget is
a one-line ``TemplateError`` naming the template and its line: exit 2.
"""

from __future__ import annotations

import contextvars
import operator
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from orchestrator.core.facts import FactError, is_none, version_of, version_test
from orchestrator.core.kept import Kept
from orchestrator.errors import ConfigError, TemplateError

Lookup = Callable[[str], "str | None"]

MAX_TEMPLATE_STEPS = 500_000
"""Loop iterations plus calls one render may take (a playbook's templates take hundreds; the
costliest step, a macro call, takes 10–12 µs here, so the whole budget stays well under
``TEMPLATE_TIME_LIMIT``: at a million steps it did not)."""

MAX_TEMPLATE_OUTPUT = 16 * 1024 * 1024
"""Characters one render may produce, and the largest string or list ``*`` may build."""

TEMPLATE_TIME_LIMIT = 10
"""Seconds the budget above stands for (documented; never measured: core keeps no clock)."""

INLINE_TEMPLATES_KEPT = 4096
"""Inline strings a renderer keeps compiled: more than a playbook holds (one renderer a run)."""


class TemplateBudgetError(Exception):
    """A render went over its budget (``MAX_TEMPLATE_STEPS``, ``MAX_TEMPLATE_OUTPUT``)."""


class _Budget:
    """What one render has spent so far."""

    __slots__ = ("steps",)

    def __init__(self) -> None:
        self.steps = 0

    def spend(self) -> None:
        self.steps += 1
        if self.steps > MAX_TEMPLATE_STEPS:
            raise TemplateBudgetError(
                f"more than {MAX_TEMPLATE_STEPS:,} loop iterations and calls "
                f"(templates have a budget of about {TEMPLATE_TIME_LIMIT} s)")

    def walk(self, iterable: Iterable[Any]) -> Iterator[Any]:
        for item in iterable:
            self.spend()
            yield item


_SPENDING: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("orch_template_budget", default=None)
"""The budget of the render running in this thread (none outside ``Renderer``'s renders)."""


class _LoopBudget(Extension):
    """Counts every ``{% for %}`` iteration against the render's budget (see ``_BudgetedSandbox``)."""

    def walk(self, iterable: Any) -> Any:
        budget = _SPENDING.get()
        return iterable if budget is None else budget.walk(iterable)



class _BudgetedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with a budget: loops, calls, ``*`` and ``**`` are counted or bounded."""

    intercepted_binops = frozenset(["*", "**"])

    def __init__(self, **options: Any) -> None:
        super().__init__(extensions=[_LoopBudget], **options)

    def _generate(self, source: nodes.Template, name: str | None, filename: str | None,
                  defer_init: bool = False) -> str:
        # Each loop's iterable goes through ``_LoopBudget.walk`` (a sandboxed call, like any other).
        for loop in source.find_all(nodes.For):
            walk = nodes.ExtensionAttribute(_LoopBudget.identifier, "walk", lineno=loop.lineno)
            loop.iter = nodes.Call(walk, [loop.iter], [], None, None, lineno=loop.lineno)
        return super()._generate(source, name, filename, defer_init)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        budget = _SPENDING.get()
        if budget is not None:
            budget.spend()
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context: Any, operator_: str, left: Any, right: Any) -> Any:
        if operator_ == "**":
            if isinstance(right, int) and abs(right) > 1024 and not (isinstance(left, int) and abs(left) <= 1):
                raise TemplateBudgetError(f"{left!r} ** {right!r} is too large to compute")
            return operator.pow(left, right)
        if operator_ == "*":
            for seq, times in ((left, right), (right, left)):
                if (isinstance(seq, str | bytes | list | tuple) and isinstance(times, int)
                        and len(seq) * times > MAX_TEMPLATE_OUTPUT):
                    raise TemplateBudgetError(
                        f"'*' would build a value of {len(seq) * times:,} items, "
                        f"more than {MAX_TEMPLATE_OUTPUT:,}")
            return operator.mul(left, right)
        return super().call_binop(context, operator_, left, right)


class _LookupLoader(jinja2.BaseLoader):
    """A Jinja loader over the injected ``lookup`` callable."""

    def __init__(self, lookup: Lookup) -> None:
        self._lookup = lookup

    def get_source(
        self, environment: jinja2.Environment, template: str
    ) -> tuple[str, str | None, Callable[[], bool] | None]:
        text = self._lookup(template)
        if text is None:
            raise jinja2.TemplateNotFound(template)
        return text, template, lambda: True  # files do not change during one run


class Renderer:
    """Renders inline strings and named template files for one playbook.

    ``searched`` describes where ``lookup`` looks (folder names), only for the
    "template not found" message; ``describe`` turns a template name into the
    file name messages should show (default: the name itself).
    """

    def __init__(
        self,
        lookup: Lookup | None = None,
        *,
        searched: Sequence[str] = (),
        describe: Callable[[str], str] | None = None,
    ) -> None:
        self._lookup: Lookup = lookup or (lambda name: None)
        self.searched = tuple(searched)
        self._describe = describe or (lambda name: name)
        self.env = _BudgetedSandbox(
            loader=_LookupLoader(self._lookup),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            autoescape=False,
        )
        # Versions compare as versions (packaging.version), never as text:
        # ``x is version('0.5.14', '>=')`` or ``version(x) >= '0.5.14'``.
        # A package without version metadata refuses both forms (FactError), and is ``none``.
        self.env.tests["version"] = version_test
        self.env.tests["none"] = is_none
        self.env.globals["version"] = version_of
        # Inline strings compiled once per renderer, not once per host: a fleet renders
        # the same playbook strings for every host (Jinja caches only named templates),
        # and its threads ask at once (``Kept``: one compiles, the others wait).
        self._compiled: Kept[str, jinja2.Template] = Kept(INLINE_TEMPLATES_KEPT)
        # A named template likewise: Jinja's own cache lets every thread that misses it
        # compile its own copy (15 of 25 did).
        self._loading = threading.Lock()

    def render_string(
        self,
        source: str,
        vars: Mapping[str, Any],
        *,
        file: str | None = None,
        line: int | None = None,
        key: str | None = None,
        source_line: int | None = None,
    ) -> str:
        """Render inline template text found in the playbook at ``file:line``.

        ``source_line`` is the playbook line of the text's first line (the
        line after ``content: |``); syntax errors point there plus the line
        inside the text.
        """
        if "{" not in source:
            return source  # nothing to render; skip the compile
        first = source_line or line
        try:
            template = self._compiled.get(source, lambda: self.env.from_string(source))
        except jinja2.TemplateSyntaxError as exc:
            at = first + (exc.lineno or 1) - 1 if first else None
            raise TemplateError(
                f"template syntax error: {exc.message}", file=file, line=at, key=key
            ) from None
        return self._render(
            template, vars, file=file, line=line, key=key, inside=None, first_line=source_line
        )

    def evaluate(
        self,
        expression: str,
        vars: Mapping[str, Any],
        *,
        file: str | None = None,
        line: int | None = None,
        key: str | None = None,
    ) -> Any:
        """The value of a Jinja2 expression (a ``when:``), in the sandbox, StrictUndefined."""
        try:
            compiled = self.env.compile_expression(expression, undefined_to_none=False)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(
                f"expression syntax error: {exc.message}", file=file, line=line, key=key
            ) from None
        token = _SPENDING.set(_Budget())
        try:
            value = compiled(**dict(vars))
            if isinstance(value, jinja2.Undefined):
                value._fail_with_undefined_error()
            return value
        except TemplateBudgetError as exc:
            message = f"template over its budget: {exc}"
        except jinja2.UndefinedError as exc:
            message = str(exc.message or exc)
        except jinja2.exceptions.SecurityError as exc:
            message = f"unsafe template operation refused: {exc}"
        except FactError as exc:
            message = str(exc)
        except Exception as exc:  # a comparison or a test failed inside the expression
            message = f"{type(exc).__name__}: {exc}"
        finally:
            _SPENDING.reset(token)
        raise TemplateError(" ".join(message.split()), file=file, line=line, key=key)

    def render_template(
        self,
        name: str,
        vars: Mapping[str, Any],
        *,
        file: str | None = None,
        line: int | None = None,
        key: str | None = None,
    ) -> str:
        """Render the template file ``name``, referenced from ``file:line`` at ``key``."""
        try:
            with self._loading:
                template = self.env.get_template(name)
        except jinja2.TemplateSyntaxError as exc:
            where = self._describe(exc.name or name)
            raise TemplateError(
                f"template syntax error: {exc.message} (referenced from {_where(file, line, key)})",
                file=where,
                line=exc.lineno,
            ) from None
        except jinja2.TemplateNotFound as exc:
            raise self._not_found(exc.name if isinstance(exc.name, str) and exc.name else name, file=file, line=line, key=key) from None
        except ConfigError as exc:
            raise exc.located(file=file, line=line, key=key) from None
        return self._render(template, vars, file=file, line=line, key=key, inside=name)

    def source(
        self,
        name: str,
        *,
        file: str | None = None,
        line: int | None = None,
        key: str | None = None,
    ) -> str:
        """The raw text of file ``name`` (for ``patch:`` diffs, which are not rendered)."""
        try:
            text = self._lookup(name)
        except ConfigError as exc:
            raise exc.located(file=file, line=line, key=key) from None
        if text is None:
            raise self._not_found(name, file=file, line=line, key=key, what="file")
        return text

    def _not_found(
        self,
        name: str,
        *,
        file: str | None,
        line: int | None,
        key: str | None,
        what: str = "template",
    ) -> TemplateError:
        looked = f" (looked in: {', '.join(self.searched)})" if self.searched else ""
        return TemplateError(f"{what} '{name}' not found{looked}", file=file, line=line, key=key)

    def _render(
        self,
        template: jinja2.Template,
        vars: Mapping[str, Any],
        *,
        file: str | None,
        line: int | None,
        key: str | None,
        inside: str | None,
        first_line: int | None = None,
    ) -> str:
        """Render within the budget; on failure name the variable, the playbook location,
        the template line."""
        token = _SPENDING.set(_Budget())
        try:
            return _bounded_concat(template.generate(dict(vars)))
        except jinja2.TemplateSyntaxError as exc:  # an {% include %} of a broken file
            raise TemplateError(
                f"template syntax error: {exc.message} (referenced from {_where(file, line, key)})",
                file=self._describe(exc.name) if exc.name else file,
                line=exc.lineno,
            ) from None
        except jinja2.TemplateNotFound as exc:
            raise self._not_found(exc.name if isinstance(exc.name, str) and exc.name else "?", file=file, line=line, key=key) from None
        except ConfigError as exc:
            raise exc.located(file=file, line=line, key=key) from None
        except jinja2.exceptions.SecurityError as exc:
            failure: Exception = exc
            message = f"unsafe template operation refused: {exc}"
        except TemplateBudgetError as exc:
            failure = exc
            message = f"template over its budget: {exc}"
        except jinja2.UndefinedError as exc:
            failure = exc
            message = str(exc.message or exc)
        except FactError as exc:
            failure = exc
            message = str(exc)
        except Exception as exc:  # a filter or an operation failed inside the template
            failure = exc
            message = f"template error: {type(exc).__name__}: {exc}"
        finally:
            _SPENDING.reset(token)
        if inside:
            inner = _template_line(failure, inside)
            shown = self._describe(inside)
            message += f" (in template {shown}" + (f" line {inner})" if inner else ")")
        elif first_line:
            inner = _template_line(failure, "<template>")
            if inner:
                line = first_line + inner - 1
        raise TemplateError(" ".join(message.split()), file=file, line=line, key=key)


def _bounded_concat(chunks: Iterable[str]) -> str:
    """The rendered text, refused once it passes ``MAX_TEMPLATE_OUTPUT`` characters."""
    out: list[str] = []
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if size > MAX_TEMPLATE_OUTPUT:
            raise TemplateBudgetError(f"the output passed {MAX_TEMPLATE_OUTPUT:,} characters")
        out.append(chunk)
    return "".join(out)


def _where(file: str | None, line: int | None, key: str | None) -> str:
    out = file or "?"
    if line:
        out += f":{line}"
    if key:
        out += f" {key}"
    return out


def _template_line(exc: BaseException, name: str) -> int | None:
    """Line inside template ``name`` where rendering failed.

    Jinja rewrites tracebacks so that template code shows up as frames whose
    filename is the template's; the innermost such frame has the line.
    """
    found: int | None = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == name:
            found = tb.tb_lineno
        tb = tb.tb_next
    return found
