"""A command group whose default command needs no word: `analyze runs/ -o report/` is `analyze compare ...`.

What the user reads must be about what they typed: `analyze --help` lists the default command's
options (they were only under `analyze compare --help`, which the README never shows), and a usage
error in `analyze runs/ --bogus` says `analyze`, not a sub-command the user never typed.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

import typer
import typer.main
from typer.core import TyperArgument, TyperGroup, TyperOption

DEFAULT_COMMAND = "compare"


class _DefaultContext(typer.Context):
    """The context of the default command run without its word: it is named as its group."""

    @property
    def command_path(self) -> str:
        return self.parent.command_path if self.parent is not None else super().command_path


class DefaultCommandGroup(TyperGroup):
    """A group that runs `compare` when the first argument is not a sub-command name.

    `lazy_commands` (command name -> "module:function", the function adding that command to a Typer app)
    names sub-commands whose module is imported only when the command is asked for, by its name or by
    the help that lists every command: the main job (`analyze runs/ -o report/`) never builds them, nor
    imports what they import."""

    lazy_commands: dict[str, str] = {}

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return [*self.commands, *(name for name in self.lazy_commands if name not in self.commands)]

    def get_command(self, ctx: typer.Context, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in self.lazy_commands:
            module, _, function = self.lazy_commands[cmd_name].partition(":")
            self.commands.update(click_commands(getattr(importlib.import_module(module), function)))
        return super().get_command(ctx, cmd_name)

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        default = self.commands.get(DEFAULT_COMMAND)
        implied = (bool(args) and args[0] not in self.commands and args[0] not in self.lazy_commands
                   and args[0] not in ("--help", "-h"))
        if default is not None:
            default.context_class = _DefaultContext if implied else typer.Context
        if implied:
            args = [DEFAULT_COMMAND, *args]
        return super().parse_args(ctx, args)

    def format_usage(self, ctx: typer.Context, formatter: Any) -> None:
        formatter.write_usage(ctx.command_path, "FILES_OR_DIRS... -o REPORTDIR [OPTIONS]")
        formatter.write_usage(ctx.command_path, "COMMAND [ARGS]...", prefix="   or: ")

    def format_options(self, ctx: typer.Context, formatter: Any) -> None:
        """The default command's options first (what `analyze FILES_OR_DIRS...` takes), then the commands."""
        default = self.commands.get(DEFAULT_COMMAND)
        if default is not None:
            sub = typer.Context(default, info_name=DEFAULT_COMMAND, parent=ctx)
            params = default.get_params(sub)
            for title, kind in (("Arguments", TyperArgument), ("Options", TyperOption)):
                rows = [r for r in (p.get_help_record(sub) for p in params if isinstance(p, kind)) if r is not None]
                if rows:
                    with formatter.section(f"{title} (analyze FILES_OR_DIRS... -o REPORTDIR; the same as "
                                           f"analyze {DEFAULT_COMMAND})"):
                        formatter.write_dl(rows)
        self.format_commands(ctx, formatter)


def click_commands(register: Callable[[typer.Typer], None]) -> dict[str, Any]:
    """The commands `register` adds to a Typer app, built as the group's own commands are built."""
    holder = typer.Typer(add_completion=False, rich_markup_mode=None)
    register(holder)
    return dict(typer.main.get_group(holder).commands)
