"""Decoding into the protocol types (strict first, lenient on failure) and exact encoding.

The rules this module keeps:

* A valid message costs one msgspec pass: ``decode`` runs a cached ``msgspec.json.Decoder`` for
  the requested type and returns its result. Nothing else happens unless msgspec rejects it.
* Only then does the lenient path run. It decodes the JSON to plain Python values and walks them
  together with the type, trying msgspec on each subtree first and stepping inside only where
  that fails. Inside, and only there, it

  - turns an unknown tag of a tagged union into an ``UnknownVariant`` holding the raw object,
  - picks the untagged variant of a union whose tag is missing,
  - replaces a malformed value marked ``x-deserialize-default-on-error`` by its default (``None``
    for an optional property) and drops a malformed item of an array marked
    ``x-deserialize-skip-invalid-items``,
  - replaces a malformed value whose type carries ``x-acp-lite-fallback`` by that value (the
    protocol version: a date string reads as version 0, which no one supports, so negotiation
    still answers with ours),
  - reads ``null`` as an empty object where the object has no required member,
  - for a type wrapped in ``keep_undecodable``, returns what still does not fit as an
    ``Undecodable`` holding the raw value and the ``SchemaError``, instead of raising.

  Every such fallback is logged on the ``acp_lite.codec`` logger and handed to the diagnostics
  hook, if the application set one. What is still invalid raises ``SchemaError`` with the JSON
  path and msgspec's expectation.
* The markers come from ``msgspec.Meta(extra=...)`` in the generated annotations and the union
  shapes from msgspec's own type information, so nothing here knows any ACP name.
* ``encode`` writes compact JSON (no newline). Absent optional fields are omitted (the generated
  structs use ``omit_defaults``); an ``UnknownVariant`` is written back as the raw object it holds.

Everything here is pure and may be called from any thread; the diagnostics hook runs on the thread
that called ``decode``/``convert``.
"""

import logging
from typing import (
    Annotated,
    Any,
    Callable,
    Dict,
    List,
    Literal,
    NamedTuple,
    Optional,
    Set,
    Tuple,
    Type,
    TypeVar,
    Union,
    get_args,
    get_origin,
    overload,
)

import msgspec

from .errors import ParseError, SchemaError

__all__ = [
    "ENCODER",
    "Fallback",
    "MethodSpec",
    "Undecodable",
    "UnknownVariant",
    "convert",
    "decode",
    "encode",
    "encode_into",
    "keep_undecodable",
    "set_diagnostics_hook",
    "strict_decoder",
    "strict_type",
    "untagged_union",
]

_log = logging.getLogger("acp_lite.codec")

DEFAULT_ON_ERROR = "x-deserialize-default-on-error"
SKIP_INVALID_ITEMS = "x-deserialize-skip-invalid-items"
FALLBACK_VALUE = "x-acp-lite-fallback"


class UnknownVariant:
    """A union member this version does not know, kept as the raw JSON object it arrived as.

    ``tag`` is the unknown discriminator value (``"notice"``), ``raw`` the whole object; encoding
    writes ``raw`` back unchanged.
    """

    __slots__ = ("raw", "tag")

    def __init__(self, raw: Dict[str, Any], tag: Optional[str] = None):
        self.raw = raw
        self.tag = tag

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnknownVariant) and other.raw == self.raw

    __hash__ = None  # type: ignore[assignment]  # mutable, like the protocol structs

    def __repr__(self) -> str:
        return f"UnknownVariant(tag={self.tag!r}, raw={self.raw!r})"


class Undecodable:
    """A value that does not fit its type even leniently, kept rather than lost: ``raw`` is the
    JSON value as it arrived (dicts, lists, ...), ``error`` the ``SchemaError`` saying where and why.

    Distinct from ``UnknownVariant``, which is a well-formed member this version does not know.
    ``decode`` returns one only for a type wrapped in ``keep_undecodable``.
    """

    __slots__ = ("error", "raw")

    def __init__(self, raw: Any, error: SchemaError):
        self.raw = raw
        self.error = error

    def __repr__(self) -> str:
        return f"Undecodable(error={self.error.message!r}, raw={self.raw!r})"


class _KeepingUndecodable(NamedTuple):
    """The stand-in type made by ``keep_undecodable``."""

    type: Any


def keep_undecodable(type_: Any) -> Any:
    """A type that decodes like ``type_``, except that a value which does not fit even leniently
    becomes an ``Undecodable`` instead of raising ``SchemaError``. Valid values cost the same."""
    return _KeepingUndecodable(type_)


def strict_type(type_: Any) -> Any:
    """The type the strict path decodes ``type_`` into: for a ``keep_undecodable`` type, the type
    it wraps (what does not fit that is the lenient path's to keep). Callers that build their own
    msgspec types around ours (the JSON-RPC envelopes) use it."""
    return type_.type if isinstance(type_, _KeepingUndecodable) else type_


class MethodSpec(NamedTuple):
    """One protocol method: its name, the type of its params and of its result.

    ``result_type`` is ``None`` for a notification.
    """

    method: str
    params_type: Any
    result_type: Any


class Fallback(NamedTuple):
    """One leniency the decoder applied: where, which kind, and what it saw.

    ``kind`` is one of ``unknown-variant``, ``default-on-error``, ``skipped-item``,
    ``fallback-value`` and ``null-as-empty``: each marks a value the schema rejects. The one
    exception is ``unknown-tag``: an unknown tag on a union with an untagged member that accepts
    the object but whose schema names its own tag; it is kept as an ``UnknownVariant``. (A member
    whose schema leaves the tag free, ``other`` of ``untagged_union``, takes such an object
    instead: an ``authMethods`` entry ``{"type": "env_var", ...}`` is an ``AuthMethodAgent``.)
    """

    path: str
    kind: str
    detail: str


_diagnostics_hook: Optional[Callable[[Fallback], None]] = None


def set_diagnostics_hook(hook: Optional[Callable[[Fallback], None]]) -> None:
    """Have ``hook`` called with every ``Fallback`` (``None`` removes it).

    The hook runs on the thread that decodes, after the message decoded; it must be quick and must
    not raise. Fallbacks are logged on ``acp_lite.codec`` whether or not a hook is set.
    """
    global _diagnostics_hook
    _diagnostics_hook = hook


# ----- unions msgspec cannot decode by itself ---------------------------------------------------


class _UntaggedUnionType(type):
    """Metaclass of the stand-ins made by ``untagged_union``.

    msgspec hands values of such a type to our ``dec_hook`` and then checks that the result is an
    instance of it; ``__instancecheck__`` accepts any of the union's members.
    """

    variants: Tuple[Any, ...]
    tag_field: Optional[str]
    tagged: Dict[str, Any]
    untagged: Tuple[Any, ...]
    other: Any
    _classes: Tuple[type, ...]

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, cls._classes)

    def __repr__(cls) -> str:
        return f"untagged_union({cls.__name__!r}, {', '.join(map(_type_name, cls.variants))})"


def untagged_union(name: str, *variants: Any, implied: Optional[Dict[str, Any]] = None, other: Any = None) -> Any:
    """A stand-in type for a union that msgspec cannot tell apart by itself.

    The members are tagged structs, found by their tag, and others (untagged structs, or any type
    msgspec decodes), tried in order when the value carries no tag. ``implied`` maps a tag value to
    the untagged member it also selects (``{"agent": AuthMethodAgent}``). ``other`` is the untagged
    member whose schema leaves the tag free: a value with a tag no member names is that member when
    it fits it (``{"type": "env_var", "id": ..., "name": ...}`` is a valid ``AuthMethodAgent``);
    any other tag is unknown.
    """
    tagged: Dict[str, Any] = dict(implied or {})
    untagged: List[Any] = []
    tag_field = None
    for variant in variants:
        config = getattr(variant, "__struct_config__", None)
        if config is not None and config.tag_field is not None:
            tag_field = config.tag_field
            tagged[config.tag] = variant
        else:
            untagged.append(variant)
    classes = tuple(c for v in variants for c in _runtime_classes(v))
    namespace = {
        "variants": variants,
        "tag_field": tag_field,
        "tagged": tagged,
        "untagged": tuple(untagged),
        "other": other,
        "_classes": classes,
        "__slots__": (),
    }
    return _UntaggedUnionType(name, (), namespace)


def _runtime_classes(type_: Any) -> Tuple[type, ...]:
    """The classes whose instances a value of ``type_`` may be, for ``isinstance``."""
    origin = get_origin(type_)
    if origin is Annotated:
        return _runtime_classes(get_args(type_)[0])
    if origin is Union:
        return tuple(c for member in get_args(type_) for c in _runtime_classes(member))
    if origin is Literal:
        return tuple({type(value) for value in get_args(type_)})
    if origin is not None:
        return (origin,)
    if type_ is None:
        return (type(None),)
    if type_ is Any or not isinstance(type_, type):
        return (object,)
    return (type_,)


def _dec_hook(type_: Any, obj: Any) -> Any:
    """Strict path: resolve an ``untagged_union`` value (msgspec calls this from C)."""
    if not isinstance(type_, _UntaggedUnionType):
        raise NotImplementedError(f"no decoder for {_type_name(type_)}")
    if type_.tag_field is not None and isinstance(obj, dict) and type_.tag_field in obj:
        variant = type_.tagged.get(obj[type_.tag_field], type_.other)
        if variant is None:
            raise ValueError(f"unknown {type_.tag_field} of `{type_.__name__}`")
        return msgspec.convert(obj, variant, dec_hook=_dec_hook)
    for variant in type_.untagged:
        try:
            return msgspec.convert(obj, variant, dec_hook=_dec_hook)
        except msgspec.ValidationError:
            continue
    raise ValueError(f"matches no variant of `{type_.__name__}`")


# ----- the public entry points ------------------------------------------------------------------

_DECODERS: Dict[Any, msgspec.json.Decoder] = {}


def strict_decoder(type_: Any) -> msgspec.json.Decoder:
    """A new msgspec decoder for ``type_`` that also resolves ``untagged_union`` members: the
    strict path alone, for callers that build their own envelope types around ours."""
    return msgspec.json.Decoder(type_, dec_hook=_dec_hook)


def _decoder(type_: Any) -> msgspec.json.Decoder:
    decoder = _DECODERS[type_] = strict_decoder(strict_type(type_))
    return decoder


_T = TypeVar("_T")
_JsonData = Union[bytes, bytearray, memoryview, str, msgspec.Raw]


@overload
def decode(data: _JsonData, type_: Type[_T]) -> _T: ...
@overload
def decode(data: _JsonData, type_: Any) -> Any: ...
def decode(data: _JsonData, type_: Any) -> Any:
    """Decode JSON ``data`` (bytes, str or a ``msgspec.Raw``) into ``type_``: strictly if it is
    valid, leniently if it is not.

    Raises ``ParseError`` when ``data`` is not JSON and ``SchemaError`` when it does not fit the
    type even leniently. Any thread.
    """
    decoder = _DECODERS.get(type_) or _decoder(type_)
    try:
        return decoder.decode(data)
    except msgspec.ValidationError:
        pass  # leave the except block so the lenient path's errors do not chain to this one
    except msgspec.DecodeError as exc:
        raise ParseError(f"invalid JSON: {exc}") from None
    try:  # msgspec stops at the first invalid value: the rest may still not be JSON
        value = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise ParseError(f"invalid JSON: {exc}") from None
    return _Lenient().run(value, type_)


@overload
def convert(obj: Any, type_: Type[_T]) -> _T: ...
@overload
def convert(obj: Any, type_: Any) -> Any: ...
def convert(obj: Any, type_: Any) -> Any:
    """Like ``decode`` for an already parsed JSON value (dicts, lists, str, int ...). Any thread."""
    try:
        return msgspec.convert(obj, strict_type(type_), dec_hook=_dec_hook)
    except msgspec.ValidationError:
        pass
    return _Lenient().run(obj, type_)


def _encode_unknown(obj: Any) -> Any:
    if isinstance(obj, UnknownVariant):
        return obj.raw
    raise TypeError(f"cannot encode a {type(obj).__name__} as protocol JSON")


ENCODER = msgspec.json.Encoder(enc_hook=_encode_unknown)
"""The shared encoder (compact JSON, unknown variants written back raw). Any thread."""


def encode(obj: Any) -> bytes:
    """``obj`` as compact JSON bytes, without a trailing newline. Any thread."""
    return ENCODER.encode(obj)


def encode_into(obj: Any, buffer: bytearray, offset: int = 0) -> None:
    """Write ``obj`` as compact JSON into ``buffer`` from ``offset`` on (``-1``: append). Any thread."""
    ENCODER.encode_into(obj, buffer, offset)


# ----- the lenient path -------------------------------------------------------------------------


class _Lenient:
    """One lenient decode: walks a parsed value along its type and records the fallbacks.

    Each ``_walk`` first lets msgspec convert the whole subtree; only when that fails does it look
    at the kind of type and step into the value. Fallbacks found inside an attempt that fails
    as a whole (a variant tried and rejected) are forgotten: only those of the result are kept.
    """

    def __init__(self) -> None:
        self.fallbacks: List[Fallback] = []

    def run(self, value: Any, type_: Any) -> Any:
        result = self._walk(value, type_, "$")
        for fallback in self.fallbacks:
            level = logging.INFO if fallback.kind in ("unknown-variant", "unknown-tag") else logging.WARNING
            _log.log(level, "%s at %s: %s", fallback.kind, fallback.path, fallback.detail)
            hook = _diagnostics_hook
            if hook is not None:
                hook(fallback)
        return result

    def _note(self, path: str, kind: str, detail: str) -> None:
        self.fallbacks.append(Fallback(path, kind, detail))

    def _walk(self, value: Any, type_: Any, path: str, skip_items: bool = False) -> Any:
        if isinstance(type_, _KeepingUndecodable):
            return self._keeping(value, type_.type, path)
        try:
            return msgspec.convert(value, type_, dec_hook=_dec_hook)
        except msgspec.ValidationError as exc:
            failure = exc
        origin = get_origin(type_)
        if origin is Annotated and _extra(type_):
            return self._annotated(value, type_, path)
        if origin is Union:
            return self._union(value, type_, path, skip_items, failure)
        if isinstance(type_, _UntaggedUnionType):
            return self._variant(value, type_.tag_field, type_.tagged, type_.untagged, path, failure, type_.other)
        if isinstance(type_, type) and issubclass(type_, msgspec.Struct):
            if isinstance(value, dict):
                return self._struct(value, type_, path)
            if value is None and not any(f.required for f in _fields(type_)):
                # Peers answer ``null`` where an object with nothing required is due (the docs
                # show it for fs/write_text_file): read it as that empty object.
                self._note(path, "null-as-empty", f"null read as an empty `{type_.__name__}`")
                return type_()
        if origin is list and isinstance(value, list):
            return self._list(value, get_args(type_)[0], path, skip_items)
        if origin is dict and isinstance(value, dict):
            return {key: self._walk(item, get_args(type_)[1], _key_path(path, key)) for key, item in value.items()}
        raise _schema_error(failure, path)

    def _keeping(self, value: Any, type_: Any, path: str) -> Any:
        mark = len(self.fallbacks)
        try:
            return self._walk(value, type_, path)
        except SchemaError as exc:
            del self.fallbacks[mark:]  # they describe a value nobody will see
            return Undecodable(value, exc)

    def _annotated(self, value: Any, type_: Any, path: str) -> Any:
        extra = _extra(type_)
        inner = _without_markers(type_)
        if FALLBACK_VALUE not in extra:
            return self._walk(value, inner, path, skip_items=bool(extra.get(SKIP_INVALID_ITEMS)))
        mark = len(self.fallbacks)
        try:
            return self._walk(value, inner, path)
        except SchemaError as exc:
            del self.fallbacks[mark:]
            self._note(path, "fallback-value", f"{exc.message}; read as {extra[FALLBACK_VALUE]!r}")
            return extra[FALLBACK_VALUE]

    def _union(self, value: Any, type_: Any, path: str, skip_items: bool, failure: Exception) -> Any:
        members = [m for m in get_args(type_) if m is not type(None)]
        if value is None and len(members) < len(get_args(type_)):
            return None
        if len(members) == 1:
            return self._walk(value, members[0], path, skip_items)
        tags = _tag_table(tuple(members))
        if tags is None:
            raise _schema_error(failure, path)
        return self._variant(value, tags[0], tags[1], (), path, failure)

    def _variant(
        self,
        value: Any,
        tag_field: Optional[str],
        tagged: Dict[str, Any],
        untagged: Tuple[Any, ...],
        path: str,
        failure: Exception,
        other: Any = None,
    ) -> Any:
        """Pick the member of a union: by tag (a tag no member names: ``other`` when it fits), else
        (no tag) the first untagged one that fits."""
        has_tag = tag_field is not None and isinstance(value, dict) and tag_field in value
        tag = value[tag_field] if has_tag else None
        if isinstance(tag, str) and tag in tagged:
            return self._walk(value, tagged[tag], path)
        if isinstance(tag, str) and other is not None and _accepts(other, value):
            return self._walk(value, other, path)
        if isinstance(tag, str):
            accepted_by = next((variant for variant in untagged if _accepts(variant, value)), None)
            if accepted_by is not None:
                self._note(
                    path,
                    "unknown-tag",
                    f"{tag_field} {tag!r} is not known to this version; "
                    f"valid as `{_type_name(accepted_by)}`, kept unknown",
                )
            else:
                self._note(path, "unknown-variant", f"{tag_field} {tag!r} is not known to this version")
            return UnknownVariant(value, tag)
        if has_tag:
            raise _schema_error(failure, path)
        first_error = None
        for variant in untagged:
            mark = len(self.fallbacks)
            try:
                return self._walk(value, variant, path)
            except SchemaError as exc:
                del self.fallbacks[mark:]
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        raise _schema_error(failure, path)

    def _struct(self, value: Dict[str, Any], cls: Any, path: str) -> Any:
        kwargs = {}
        for field in _fields(cls):
            sub = _key_path(path, field.encode_name)
            if field.encode_name not in value:
                if field.required:
                    raise SchemaError(
                        f"Object missing required field `{field.encode_name}` - at `{path}`",
                        path=path,
                        expected=f"field `{field.encode_name}`",
                    )
                continue
            mark = len(self.fallbacks)
            try:
                kwargs[field.name] = self._walk(value[field.encode_name], field.type, sub)
            except SchemaError as exc:
                if not _extra(field.type).get(DEFAULT_ON_ERROR):
                    raise
                default = _empty_value(field.type) if field.required else field.default
                if field.required and default is None:
                    raise
                del self.fallbacks[mark:]
                self._note(sub, "default-on-error", f"{exc.message}; using the default")
                if field.required:
                    kwargs[field.name] = default
        return cls(**kwargs)

    def _list(self, value: List[Any], item_type: Any, path: str, skip_items: bool) -> List[Any]:
        items = []
        for index, item in enumerate(value):
            sub = f"{path}[{index}]"
            mark = len(self.fallbacks)
            try:
                items.append(self._walk(item, item_type, sub))
            except SchemaError as exc:
                if not skip_items:
                    raise
                del self.fallbacks[mark:]
                self._note(sub, "skipped-item", f"{exc.message}; item dropped")
        return items


# ----- type introspection helpers ---------------------------------------------------------------

_FIELDS: Dict[type, Tuple[Any, ...]] = {}
_TAG_TABLES: Dict[Tuple[Any, ...], Optional[Tuple[str, Dict[str, Any]]]] = {}


def _accepts(type_: Any, value: Any) -> bool:
    """Whether ``value`` fits ``type_`` strictly (the schema's verdict, without leniency)."""
    try:
        msgspec.convert(value, type_, dec_hook=_dec_hook)
    except msgspec.ValidationError:
        return False
    return True


def _fields(cls: type) -> Tuple[Any, ...]:
    fields = _FIELDS.get(cls)
    if fields is None:
        fields = _FIELDS[cls] = msgspec.structs.fields(cls)
    return fields


def _tag_table(members: Tuple[Any, ...]) -> Optional[Tuple[str, Dict[str, Any]]]:
    """(tag field, tag -> struct) when every member is a struct tagged on the same field."""
    if members not in _TAG_TABLES:
        table: Dict[str, Any] = {}
        fields: Set[Optional[str]] = set()
        for member in members:
            config = getattr(member, "__struct_config__", None)
            fields.add(config.tag_field if config is not None else None)
            if config is not None:
                table[config.tag] = member
        tag_field = fields.pop() if len(fields) == 1 else None
        _TAG_TABLES[members] = (tag_field, table) if tag_field is not None else None
    return _TAG_TABLES[members]


def _extra(type_: Any) -> Dict[str, Any]:
    """The merged ``msgspec.Meta(extra=...)`` of an ``Annotated`` type (empty for others)."""
    if get_origin(type_) is not Annotated:
        return {}
    merged: Dict[str, Any] = {}
    for meta in get_args(type_)[1:]:
        if isinstance(meta, msgspec.Meta) and meta.extra:
            merged.update(meta.extra)
    return merged


def _without_markers(type_: Any) -> Any:
    """An ``Annotated`` type without its ``extra`` markers, keeping its other constraints."""
    base, *metas = get_args(type_)
    kept = [m for m in metas if not (isinstance(m, msgspec.Meta) and m.extra)]
    return Annotated[tuple([base, *kept])] if kept else base


def _empty_value(type_: Any) -> Any:
    """``[]`` or ``{}`` for an array or map type (seen through Annotated/Optional), else None."""
    while get_origin(type_) in (Annotated, Union):
        type_ = next(a for a in get_args(type_) if a is not type(None))
    origin = get_origin(type_)
    if origin is list:
        return []
    if origin is dict:
        return {}
    return None


def _key_path(path: str, key: str) -> str:
    return f"{path}.{key}"


def _schema_error(exc: Exception, path: str) -> SchemaError:
    """msgspec's message with its path made absolute: ``Expected `str`, got `int` - at `$.a.b```."""
    text = str(exc)
    message, sep, where = text.rpartition(" - at `")
    full = path + where[1:-1] if sep else path
    if not sep:
        message = text
    expected = message.split("`")[1] if message.startswith("Expected `") else message
    return SchemaError(f"{message} - at `{full}`", path=full, expected=expected)


def _type_name(type_: Any) -> str:
    return getattr(type_, "__name__", None) or repr(type_)
