"""Jinja2 rendering in a sandbox, with one-line errors that say where.

Templates come from playbooks people share, so they render in Jinja2's
immutable sandbox with ``StrictUndefined``: a typo'd variable is an error,
never an empty string spliced into ``server_args.py``. The file reading is
injected (``lookup``) so this module stays pure; the shell layer supplies it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from orchestrator.core.facts import FactError, is_none, version_of, version_test
from orchestrator.errors import ConfigError, TemplateError

Lookup = Callable[[str], "str | None"]


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
        self.env = ImmutableSandboxedEnvironment(
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
        # the same playbook strings for every host (Jinja caches only named templates).
        self._compiled: dict[str, jinja2.Template] = {}

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
            template = self._compiled.get(source) or self._compiled.setdefault(
                source, self.env.from_string(source))
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
        try:
            value = compiled(**dict(vars))
            if isinstance(value, jinja2.Undefined):
                value._fail_with_undefined_error()
            return value
        except jinja2.UndefinedError as exc:
            message = str(exc.message or exc)
        except jinja2.exceptions.SecurityError as exc:
            message = f"unsafe template operation refused: {exc}"
        except FactError as exc:
            message = str(exc)
        except Exception as exc:  # a comparison or a test failed inside the expression
            message = f"{type(exc).__name__}: {exc}"
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
            template = self.env.get_template(name)
        except jinja2.TemplateSyntaxError as exc:
            where = self._describe(exc.name or name)
            raise TemplateError(
                f"template syntax error: {exc.message} (referenced from {_where(file, line, key)})",
                file=where,
                line=exc.lineno,
            ) from None
        except jinja2.TemplateNotFound as exc:
            raise self._not_found(exc.name or name, file=file, line=line, key=key) from None
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
        """Render; on failure name the variable, the playbook location, the template line."""
        try:
            return template.render(dict(vars))
        except jinja2.TemplateSyntaxError as exc:  # an {% include %} of a broken file
            raise TemplateError(
                f"template syntax error: {exc.message} (referenced from {_where(file, line, key)})",
                file=self._describe(exc.name) if exc.name else file,
                line=exc.lineno,
            ) from None
        except jinja2.TemplateNotFound as exc:
            raise self._not_found(exc.name or "?", file=file, line=line, key=key) from None
        except ConfigError as exc:
            raise exc.located(file=file, line=line, key=key) from None
        except jinja2.exceptions.SecurityError as exc:
            failure: Exception = exc
            message = f"unsafe template operation refused: {exc}"
        except jinja2.UndefinedError as exc:
            failure = exc
            message = str(exc.message or exc)
        except FactError as exc:
            failure = exc
            message = str(exc)
        except Exception as exc:  # a filter or an operation failed inside the template
            failure = exc
            message = f"template error: {type(exc).__name__}: {exc}"
        if inside:
            inner = _template_line(failure, inside)
            shown = self._describe(inside)
            message += f" (in template {shown}" + (f" line {inner})" if inner else ")")
        elif first_line:
            inner = _template_line(failure, "<template>")
            if inner:
                line = first_line + inner - 1
        raise TemplateError(" ".join(message.split()), file=file, line=line, key=key)


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
