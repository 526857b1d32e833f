"""sglang.srt.arg_groups' arg_utils and argparse_actions (0.5.15+; not part of the host
tree): faithful copies of SGLang's logic, so that the tree's real ServerArgs builds the
real parser."""
import argparse
import dataclasses
import json
import logging
import types


def arg_utils_attrs():
    import typing
    Annotated = getattr(typing, "Annotated", None)
    if Annotated is None:  # Python < 3.9: SGLang 0.5.15 needs >= 3.10 anyway
        return {}
    get_origin, get_args = typing.get_origin, typing.get_args

    @dataclasses.dataclass(frozen=True)
    class Arg(object):
        help: str = ""
        choices: object = None
        aliases: object = None
        cli_name: object = None
        type_parser: object = None
        nargs: object = None
        required: object = None
        action: object = None
        action_kwargs: object = None
        const: object = None
        no_cli: bool = False
        resolvable: bool = False

    def _unwrap_annotated(tp):
        if get_origin(tp) is Annotated:
            args = get_args(tp)
            for a in args[1:]:
                if isinstance(a, Arg):
                    return args[0], a
                if isinstance(a, str):
                    return args[0], Arg(help=a)
            return args[0], None
        return tp, None

    def _unwrap_optional(tp):
        origin = get_origin(tp)
        if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
            non_none = [a for a in get_args(tp) if a is not type(None)]
            if len(non_none) == 1:
                return non_none[0], True
        return tp, False

    def _infer_type_func(tp):
        return tp if tp in (str, int, float) else str

    def _field_default(field):
        if field.default is not dataclasses.MISSING:
            return field.default
        if field.default_factory is not dataclasses.MISSING:
            return field.default_factory()
        return dataclasses.MISSING

    def resolvable_fields(cls):
        if not dataclasses.is_dataclass(cls):
            return frozenset()
        hints = typing.get_type_hints(cls, include_extras=True)
        return frozenset(f.name for f in dataclasses.fields(cls)
                         if (_unwrap_annotated(hints.get(f.name, f.type))[1] or Arg()).resolvable)

    def add_cli_args_from_dataclass(parser, cls, fields=None):
        hints = typing.get_type_hints(cls, include_extras=True)
        for field in dataclasses.fields(cls):
            if fields is not None and field.name not in fields:
                continue
            hint = hints.get(field.name)
            if hint is None:
                continue
            raw_type, meta = _unwrap_annotated(hint)
            if meta is None or meta.no_cli:
                continue
            cli_name = meta.cli_name or "--" + field.name.replace("_", "-")
            names = [cli_name] + list(meta.aliases or [])
            default = _field_default(field)
            auto_dest = cli_name.lstrip("-").replace("-", "_")
            kwargs = {"dest": field.name} if field.name != auto_dest else {}
            kwargs["help"] = meta.help
            if default is not dataclasses.MISSING:
                kwargs["default"] = default
            if meta.action is not None:
                kwargs["action"] = meta.action
                kwargs.update(meta.action_kwargs or {})
                parser.add_argument(*names, **kwargs)
                continue
            inner, _ = _unwrap_optional(raw_type)
            if meta.const is not None:
                kwargs["const"] = meta.const
            if get_origin(inner) is typing.Literal:
                vals = list(get_args(inner))
                kwargs["type"] = meta.type_parser or _infer_type_func(type(vals[0]) if vals else str)
                kwargs["choices"] = meta.choices or vals
            elif get_origin(inner) in (list, typing.List) and meta.type_parser is None:
                elem = get_args(inner)
                kwargs["type"] = _infer_type_func(elem[0] if elem else str)
                kwargs["nargs"] = meta.nargs or "+"
                if meta.choices:
                    kwargs["choices"] = meta.choices
            elif inner is bool:
                kwargs["action"] = "store_true"
                kwargs.pop("const", None)
            else:
                kwargs["type"] = meta.type_parser or _infer_type_func(inner)
                if meta.choices:
                    kwargs["choices"] = meta.choices
                if meta.nargs:
                    kwargs["nargs"] = meta.nargs
                if (meta.required is True or (meta.required is None and default is dataclasses.MISSING)) \
                        and any(n.startswith("-") for n in names):
                    kwargs["required"] = True
            parser.add_argument(*names, **kwargs)

    return {"A": Annotated, "Arg": Arg, "add_cli_args_from_dataclass": add_cli_args_from_dataclass,
            "resolvable_fields": resolvable_fields}


def print_deprecated_warning(message):
    logging.getLogger("sglang.srt.arg_groups.argparse_actions").warning("\033[1;33m%s\033[0m" % message)


class LoRAPathAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        paths = []
        for path in values or []:
            path = path.strip()
            paths.append(json.loads(path) if path.startswith("{") and path.endswith("}") else path)
        setattr(namespace, self.dest, paths)


class DeprecatedAction(argparse.Action):
    def __init__(self, option_strings, dest, nargs=0, error_message=None, **kwargs):
        # 0.5.19+: a deprecated flag may carry its own message.
        self.error_message = error_message
        super(DeprecatedAction, self).__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print_deprecated_warning("The command line argument '%s' is deprecated and will be removed in future versions." % option_string)


class _DeprecatedWithReplacement(argparse.Action):
    def _warn(self, option_string):
        replacement = " Use '%s' instead." % self.new_flag if self.new_flag else ""
        print_deprecated_warning("'%s' is deprecated and will be removed in a future release.%s" % (option_string, replacement))


class DeprecatedStoreTrueAction(_DeprecatedWithReplacement):
    def __init__(self, option_strings, dest, new_flag=None, nargs=0, const=True, default=False, **kwargs):
        self.new_flag = new_flag
        super(DeprecatedStoreTrueAction, self).__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        self._warn(option_string)
        setattr(namespace, self.dest, True)


class DeprecatedStoreConstAction(_DeprecatedWithReplacement):
    def __init__(self, option_strings, dest, new_flag=None, const_value=None, nargs=0, default=None, **kwargs):
        self.new_flag, self.const_value = new_flag, const_value
        super(DeprecatedStoreConstAction, self).__init__(option_strings, dest, nargs=nargs, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        self._warn(option_string)
        setattr(namespace, self.dest, self.const_value)


class DeprecatedAliasStoreAction(_DeprecatedWithReplacement):
    def __init__(self, option_strings, dest, new_flag=None, **kwargs):
        self.new_flag = new_flag
        super(DeprecatedAliasStoreAction, self).__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        self._warn(option_string)
        setattr(namespace, self.dest, values)
