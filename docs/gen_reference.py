"""The reference pages (CLI, configuration fields, RPC methods), generated from the code at `mkdocs build` time by
mkdocs-gen-files. The page builders are pure functions returning Markdown (tests call them without mkdocs)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import re
import textwrap
import tokenize

import typer.main

from rocket import access, config, node
from rocket.cli import _reflow, build_app, run
from rocket.roles.broker.role import Broker
from rocket.roles.controller.role import ControllerRole
from rocket.roles.nameserver.role import Nameserver
from rocket.roles.storage.role import StorageRole
from rocket.transport import guard, methods, rpc


def cell(text: object) -> str:
    """Plain text for a table cell: one line, `|` escaped, `<` not taken for HTML."""
    return " ".join(str(text).split()).replace("|", "\\|").replace("<", "&lt;")


def code(text: object) -> str:
    """A code span (Python-Markdown's tables split no cell at a `|` inside one); nothing for ''."""
    text = " ".join(str(text).split())
    return f"``{text}``" if "`" in text else f"`{text}`" if text else ""


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def banner(title: str, source: str) -> str:
    return f"# {title}\n\n*Generated from the code by `docs/gen_reference.py`, from {source}: do not edit.*\n"


def flag_names(option) -> str:
    return " / ".join(code(", ".join(opts)) for opts in (option.opts, option.secondary_opts) if opts)


def comments(source: str) -> tuple[dict[int, str], dict[int, str]]:
    """Line number -> the comment above it (the block of comment lines just before), and -> the comment after its code."""
    alone, after = {}, {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            (alone, after)[bool(token.line[:token.start[1]].strip())][token.start[0]] = token.string.lstrip("#").strip()
    above: dict[int, str] = {}
    for row in sorted(alone):  # a block grows down, line by line
        above[row + 1] = f"{above.pop(row, '')} {alone[row]}".strip()
    return above, after


# ---- CLI ----------------------------------------------------------------------------------------------------------

def cli_commands() -> list[tuple[str, object, object]]:
    """(path, command, context) for `rocket` and every command under it that is not hidden, as the groups list them."""
    root = typer.main.get_command(build_app())
    _reflow(root)  # as `rocket --help` shows help: each paragraph on one line
    found, pending = [], [(root, root.context_class(root, info_name="rocket"))]  # typer's own click's contexts
    while pending:
        command, context = pending.pop(0)
        found.append((context.command_path, command, context))
        names = command.list_commands(context) if hasattr(command, "list_commands") else []
        children = [(name, command.get_command(context, name)) for name in names]
        pending[0:0] = [(child, child.context_class(child, info_name=name, parent=context))
                        for name, child in children if not child.hidden]
    return found


def cli_default(param) -> str:
    """The default as `--help` shows it (for a pair of flags, the one that is on)."""
    value = param.default
    if isinstance(param.show_default, str):
        return cell(param.show_default)
    if value is None or not param.show_default or callable(value) or value in ((), []):
        return ""
    if getattr(param, "is_flag", False):
        return code(param.opts[0] if value else param.secondary_opts[0]) if param.secondary_opts else ""
    return code(", ".join(map(str, value)) if isinstance(value, (list, tuple)) else value)


def cli_page() -> str:
    parts = [banner("CLI reference", "`rocket.cli.build_app()`, the typer app of the `rocket` command"),
             "Each command also takes `--help`.\n"]
    for path, command, context in cli_commands():
        parts += [f"## {path}\n", (command.help or "").replace("<", "&lt;").strip() + "\n",
                  f"```text\n{command.get_usage(context).strip()}\n```\n"]
        rows = []
        for param in (param for param in command.params if not param.hidden):
            option = param.param_type_name == "option"
            kind = (param.display_type_rich(context) if option else param.display_type(context)) or "flag"
            notes = [cell(param.help)] if param.help else []
            notes += [f"Environment: {code(param.envvar)}."] if param.envvar else []
            notes += [f"Range: {code(f'{param.min}..{param.max}')}."] if (param.min, param.max) != (None, None) else []
            rows.append([flag_names(param) if option else code(param.display_name_raw),
                         cell(kind.strip("<>") + ("" if option else " (argument)")), cli_default(param),
                         "yes" if param.required else "", " ".join(notes)])
        parts += [table(["Name", "Type", "Default", "Required", "Help"], rows)] if rows else []
    return "\n".join(parts)


# ---- configuration ------------------------------------------------------------------------------------------------

def field_comments(cls: type) -> dict[str, str]:
    """Each field's comment in the class's source: the lines just above it, and the one after it on its line."""
    source = textwrap.dedent(inspect.getsource(cls))
    above, after = comments(source)
    return {item.target.id: f"{above.get(item.lineno, '')} {after.get(item.end_lineno, '')}".strip()
            for item in ast.parse(source).body[0].body if isinstance(item, ast.AnnAssign)}


def speaks_for(comment: str, first: str, name: str) -> bool:
    """Whether the comment above field `first` covers `name`, an uncommented field after it: one of its family
    (tier_*, tcp_*), named in it, or under a short heading such as 'Transactions:'."""
    heading, colon, _ = comment.partition(":")
    return (first.split("_")[0] == name.split("_")[0] or name in comment
            or bool(colon) and heading[:1].isupper() and len(heading.split()) <= 3)


def run_flags() -> dict:
    """NodeConfig field -> its `rocket run` option, from the flags dict `rocket run` hands to config.load."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(run.run)))
    flags = next(item.value for item in ast.walk(tree) if isinstance(item, ast.Assign) and item.targets[0].id == "flags")
    options = {param.name: param for param in typer.main.get_command(build_app(node_only=True)).commands["run"].params}
    return {key.value: options[value.id] for key, value in zip(flags.keys, flags.values)}


def config_default(value: object) -> str:
    return code(str(value).lower() if isinstance(value, bool) else ",".join(map(str, value)) or "[]"
                if type(value) is tuple else '""' if value == "" else "none" if value is None else value)  # Address: str


def config_page() -> str:
    loader = inspect.getsource(config.load)
    assert 'f"ROCKET_{key.upper()}"' in loader and "document.items()" in loader, "config.load changed: update this"
    precedence = config.__doc__.split("\n")[0].partition(":")[2].strip().rstrip(".")
    flags, described, rows, first = run_flags(), field_comments(config.NodeConfig), [], ""
    for field in dataclasses.fields(config.NodeConfig):
        first = field.name if described[field.name] else first
        flag = flags.get(field.name)
        description = described[field.name] or (flag.help if flag is not None else "")
        if not description and first and speaks_for(described[first], first, field.name):
            description = f"See `{first}`."
        low_high = field.metadata.get("range")
        allowed = f"{config_default(low_high[0])} to {config_default(low_high[1])}" if low_high else ""
        rows.append([code(field.name), code(field.type), config_default(field.default), allowed,
                     code(f"ROCKET_{field.name.upper()}"), code(field.name), flag_names(flag) if flag else "",
                     cell(description)])
    return "\n".join([
        banner("Configuration fields", "`rocket.config.NodeConfig` (its fields and the comments beside them), "
                                       "`rocket.config.load` and `rocket run`"),
        f"Precedence: {precedence}; `rocket.config.load` merges the three, later ones winning, and checks every "
        "value (a bad one is a `ConfigError` naming the key: `rocket run` exits with status 2).\n",
        "A TOML file (`rocket run --config FILE`) sets a field by its name, at the top level; the environment by "
        "`ROCKET_` and the name in capitals; `rocket run` has flags for some.\n",
        "A number with a range takes only values within it, both ends included.\n",
        table(["Field", "Type", "Default", "Range", "Environment", "TOML key", "`rocket run` flag", "Description"],
              rows)])


# ---- RPC methods --------------------------------------------------------------------------------------------------

# role -> where it registers its handlers: a class and its methods, or a function
ROLES = {"nameserver": (Nameserver, "register", "acl_methods"), "broker": (Broker, "register"),
         "storage": (StorageRole, "register"), "controller": (ControllerRole, "register"),
         "Raft host": (None, node.build_roles)}
TITLES = {"dispatcher": "Answered by the dispatcher (every node)", "nameserver": "Nameserver", "broker": "Broker",
          "storage": "Storage", "controller": "Standalone controller (--role controller)",
          "Raft host": "Raft host (every node)", "none": "Served by no role"}


def parts_of(cls: type) -> dict[str, type]:
    """A role's parts, by the attribute its __init__ keeps each in: {"admin": Admin} for self.admin = Admin(...) (for
    self.x = A(...) if ... else B(...), the default B)."""
    module = inspect.getmodule(cls)
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))  # type: ignore[misc]
    made = {target.attr: item.value.orelse if isinstance(item.value, ast.IfExp) else item.value
            for item in ast.walk(tree) if isinstance(item, ast.Assign)
            for target in item.targets if isinstance(target, ast.Attribute)}
    return {attr: getattr(module, value.func.id) for attr, value in made.items() if isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name) and isinstance(getattr(module, value.func.id, None), type)}


def handler_of(cls: type | None, value: ast.expr) -> object:
    """The function a registration names: self.ping, a part's self.admin.ping, or acl.acl_grant (acl = self.acl)."""
    if cls is None or not isinstance(value, ast.Attribute):
        return None
    owner = value.value
    if isinstance(owner, ast.Name) and owner.id == "self":
        return getattr(cls, value.attr, None)
    part = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else ""
    return getattr(parts_of(cls).get(part), value.attr, None)


HANDLES = ("handle", "handle_typed")  # the Dispatcher methods a role registers a handler with


def method_servers() -> dict[str, list[tuple[str, str]]]:
    """Method -> [(role, the first sentence of its handler's docstring)], from the code where each role registers."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(rpc.Dispatcher)))
    answered = {item.value for item in ast.walk(tree)
                if isinstance(item, ast.Constant) and item.value in methods.METHODS}
    found = {name: [("dispatcher", "")] for name in sorted(answered | guard.ABOUT_CONNECTION)}
    for role, (cls, *functions) in ROLES.items():
        module = inspect.getmodule(cls or functions[0])
        for function in functions:
            for item in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(getattr(cls, function) if cls else function)))):
                pairs = list(zip(item.keys, item.values)) if isinstance(item, ast.Dict) else \
                    [item.elts] if isinstance(item, ast.Tuple) and len(item.elts) == 2 else \
                    [item.args] if isinstance(item, ast.Call) and getattr(item.func, "attr", "") in HANDLES else []
                for key, value in pairs:  # {"Ping": self.ping}, ("StorageAppend", self.append), .handle("X", f)
                    if isinstance(key, ast.Constant) and key.value in methods.METHODS:
                        handler = handler_of(cls, value)
                        paragraph = " ".join(inspect.cleandoc(getattr(handler, "__doc__", "") or "").split("\n\n")[0].split())
                        found.setdefault(key.value, []).append((role, re.split(r"(?<=\.)\s+(?=[A-Z])", paragraph)[0]))
                if isinstance(item, ast.Name) and isinstance(getattr(module, item.id, None), tuple):
                    for name in sorted(set(getattr(module, item.id)) & set(methods.METHODS)):  # the broker's FORWARDED
                        found.setdefault(name, []).append((f"{role} (forwards it to the nameservers)", ""))
    return found


def spec_comments() -> dict[str, str]:
    """Method -> the comment with its MethodSpec in METHODS, but not one that heads a run of them ('Between nodes:
    brokers and storage nodes to the nameservers,')."""
    above, after = comments(source := inspect.getsource(methods))
    found = {}
    for item in ast.walk(ast.parse(source)):
        if isinstance(item, ast.Call) and getattr(item.func, "id", "") == "MethodSpec":
            text = above.get(item.lineno, "")
            text = text if text[:1].isupper() and text.endswith(".") else ""
            found[item.args[0].value] = f"{text} {after.get(item.end_lineno, '')}".strip()
    return found


def who(spec: methods.MethodSpec) -> str:
    if spec.internal or spec.name in access.OPEN or not access.covers(spec.name):
        return "nodes only" if spec.internal else "anyone" if spec.name in access.OPEN else "super users"
    needs = access.needs_of(spec.name, {"topic": "-", "group": "-", "bucket": "-"})
    return f"`{needs[0][0]}` on " + ", ".join(pair[1].partition(":")[0] for pair in needs) if needs else "signed-in users"


def wire(spec: methods.MethodSpec) -> str:
    notes = ["inline (TCP read loop)"] * spec.inline + [f"request `{spec.attachment_field}` out of band"] * bool(
        spec.attachment_field) + [f"response `{spec.response_attachment}` out of band"] * bool(spec.response_attachment)
    notes += ["response `{}[].{}` out of band".format(*spec.response_attachments)] if spec.response_attachments else []
    return "; ".join(notes + ["at most once"] * spec.at_most_once)


def rpc_page() -> str:
    servers, described = method_servers(), spec_comments()
    groups: dict[str, list[list[str]]] = {role: [] for role in TITLES}
    for name, spec in methods.METHODS.items():  # in the table's order
        served = servers.get(name, [("none", "")])
        description = described[name] or next((doc for _, doc in served if doc), "")
        groups[served[0][0]].append([code(name), "yes" if spec.streaming else "", cell(who(spec)), code(spec.request_type),
                                     code(spec.response_type), cell(", ".join(role for role, _ in served)), wire(spec),
                                     cell(description)])
    parts = [banner("RPC methods", "`rocket.transport.methods.METHODS` (the dispatcher's `MethodSpec` table), "
                                   "`rocket.access` and the roles' `register` methods"),
             f"The dispatcher knows {len(methods.METHODS)} methods, over TCP and HTTP/2 alike, grouped by the role "
             "serving them. *Who*: with auth on, what a caller needs (`anyone`: before signing in; super users may "
             "call all); "
             "with a cluster secret or `tls_ca`, `nodes only` methods answer only the cluster's nodes. *Wire*: "
             "*inline* methods are served in the TCP read loop, with no task (the hot path); *out of band* bytes "
             "travel beside the encoded message, uncopied. *Description*: the comment in `METHODS`, else the first "
             "sentence of the handler's docstring.\n"]
    for role, rows in groups.items():
        parts += [f"## {TITLES[role]}\n", table(["Method", "Stream", "Who", "Request", "Response", "Served by", "Wire",
                                                 "Description"], rows)] if rows else []
    return "\n".join(parts)


PAGES = {"reference/cli.md": cli_page, "reference/config.md": config_page, "reference/rpc.md": rpc_page}

if __name__ in ("__main__", "<run_path>"):  # run by mkdocs-gen-files (runpy.run_path); the tests import it
    import mkdocs_gen_files

    for path, build in PAGES.items():
        with mkdocs_gen_files.open(path, "w") as page:
            page.write(build())
