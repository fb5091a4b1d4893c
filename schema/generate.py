"""Generate acp_lite's typed model (``acp_lite/schema.py``) from a structure file in ``schema/``.

Usage, from the repository root:

    python schema/generate.py schema/v1/structure.json --out acp_lite/schema.py
    python schema/generate.py schema/v2/structure.json --out acp_lite/v2/schema.py --codec ..codec

The generator reads nothing but that file: the ACP JSON Schema reduced to its structure by
``schema/derive.py``, with the protocol version and the method names under ``x-acp-lite-methods``
and the sha256 of the upstream schema under ``x-acp-lite-derived``. The rules, in the order a
reader meets them in the output:

* Every ``$def`` becomes one public name spelled exactly as the def.
* Scalars become aliases (``SessionId = str``); integer ranges come from ``minimum``/``maximum``
  and from the ``format`` (``uint16`` ...) as ``msgspec.Meta`` bounds. A closed set of string
  constants becomes a ``Literal``; an open set (one more alternative that accepts any string)
  becomes the plain scalar.
* Objects become ``msgspec.Struct`` classes: keyword-only fields in the schema's property order,
  snake_case attributes renamed to the exact JSON names, optional properties default to ``None``
  and are omitted from the output when ``None``. The ``x-deserialize-*`` markers travel as
  ``msgspec.Meta(extra=...)`` on the field so ``acp_lite.codec`` can honour them.
* A union whose alternatives carry a constant discriminator (``"type": "text"``) is a tagged
  union: one Struct per tag, tagged with msgspec's ``tag_field``/``tag``. The def an alternative
  refers to becomes that tagged Struct when nothing else refers to it; otherwise a new class is
  made and named after the tag (``agent_message_chunk`` -> ``AgentMessageChunk``), or, when that
  name is already taken, after the union and the tag (``SessionUpdateToolCallUpdate``). Properties
  the union object itself declares are copied into every variant.
* Alternatives of an object that carry no discriminator and no tagged sibling (scopes such as
  "either sessionId or requestId") are merged into the object as optional fields.
* A tagged alternative whose payload is a union tagged by another property becomes one class:
  the inner tag a required field, the inner variants' properties optional fields.
* Unions msgspec can decode natively stay ``typing.Union``. The others (an alternative without a
  tag beside tagged ones, two untagged objects, two arrays) become ``untagged_union(...)`` stand-ins
  that the codec resolves. An alternative without a tag beside tagged ones is chosen when the tag
  is absent or equals the alternative's title (``stdio``, ``agent``); when its def does not
  declare the tag property, the schema accepts any value there, so it is also chosen (``other``)
  for a tag no sibling names if the object fits it (``{"type": "env_var", "id": ..., "name": ...}``
  is a valid ``agent`` auth method). Every union with a
  discriminator is open: type checkers see ``UnknownVariant`` among its members, since a newer
  peer may send a tag we do not know.
* ``x-method``/``x-side`` build the method tables; a def referred to under a JSON-RPC ``result``
  property is the method's result type, the other one its params type.

The output is deterministic: same input, same bytes.
"""

import argparse
import json
import keyword
import os
import re
import sys
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

# Leniency that real peers need but the schema cannot express: clients have sent date strings as
# protocolVersion, and reading them as version 0 lets negotiation answer with the version we speak.
FALLBACKS: Dict[str, Any] = {"ProtocolVersion": 0}

DEFAULT_ON_ERROR = "x-deserialize-default-on-error"
SKIP_INVALID_ITEMS = "x-deserialize-skip-invalid-items"
FALLBACK = "x-acp-lite-fallback"

_INT_FORMATS = {
    "uint8": (0, 2**8 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
}
_SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool"}
# Names an attribute must not take: annotations are resolved with the class body in scope.
_RESERVED_ATTRS = {"str", "int", "float", "bool", "msgspec", "typing"}


class SchemaShapeError(Exception):
    """The schema uses a construct this generator does not model."""


def pascal(text: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^0-9A-Za-z]+", text) if part)


def snake(name: str) -> str:
    attr = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name.lstrip("_"))
    attr = re.sub(r"[^0-9A-Za-z_]", "_", attr).lower()
    if keyword.iskeyword(attr) or attr in _RESERVED_ATTRS or attr[:1].isdigit():
        attr += "_"
    return attr


def _ref_name(node: Dict[str, Any]) -> Optional[str]:
    """The def a node stands for: a bare ``$ref`` or a single-element ``allOf`` around one."""
    if "$ref" in node:
        return node["$ref"].rsplit("/", 1)[-1]
    all_of = node.get("allOf")
    if all_of and len(all_of) == 1 and "$ref" in all_of[0]:
        return all_of[0]["$ref"].rsplit("/", 1)[-1]
    return None


def _count_refs(node: Any, counts: Counter) -> None:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            counts[node["$ref"].rsplit("/", 1)[-1]] += 1
        for value in node.values():
            _count_refs(value, counts)
    elif isinstance(node, list):
        for value in node:
            _count_refs(value, counts)


def _alternatives(node: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The alternatives of a oneOf/anyOf, with nested pure unions flattened."""
    flat: List[Dict[str, Any]] = []
    for alt in node.get("oneOf", []) + node.get("anyOf", []):
        if ("anyOf" in alt or "oneOf" in alt) and not _is_object(alt) and "$ref" not in alt and "allOf" not in alt:
            flat.extend(_alternatives(alt))
        else:
            flat.append(alt)
    return flat


def _is_object(node: Dict[str, Any]) -> bool:
    return node.get("type") == "object" or "properties" in node


def _is_null(node: Dict[str, Any]) -> bool:
    return node.get("type") == "null"


def _is_catch_all(alt: Dict[str, Any]) -> bool:
    """An alternative standing for "any other tag" (``not`` the known ones)."""
    return "not" in alt


def _tag_of(alt: Dict[str, Any]) -> Optional[Tuple[str, str]]:
    """(property, value) when the alternative pins one required property to a string constant."""
    required = set(alt.get("required", []))
    for prop, schema in alt.get("properties", {}).items():
        if isinstance(schema, dict) and isinstance(schema.get("const"), str) and prop in required:
            return prop, schema["const"]
    return None


def _shared_part(base: Dict[str, Any], required: List[str], tag: Optional[Tuple[str, str]]) -> Dict[str, Any]:
    """The properties a union object declares for every variant, less the variant's tag: msgspec
    writes the tag itself (a union may also declare its tag property, as an open string)."""
    tag_field = tag[0] if tag else None
    return {
        "properties": {k: v for k, v in base.items() if k != tag_field},
        "required": [k for k in required if k != tag_field],
    }


class Field:
    def __init__(self, json_name: str, annotation: str, required: bool):
        self.json_name = json_name
        self.attr = snake(json_name)
        self.annotation = annotation
        self.required = required

    def render(self) -> str:
        rename = self.attr != self.json_name
        if self.required:
            value = f' = msgspec.field(name="{self.json_name}")' if rename else ""
            return f"    {self.attr}: {self.annotation}{value}"
        value = f'msgspec.field(default=None, name="{self.json_name}")' if rename else "None"
        return f"    {self.attr}: {self.annotation} = {value}"


class StructSpec:
    def __init__(
        self,
        name: str,
        fields: List[Field],
        base: str = "_SchemaStruct",
        tag: Optional[Tuple[str, str]] = None,
        doc: str = "",
    ):
        self.name = name
        self.fields = fields
        self.base = base
        self.tag = tag
        self.doc = doc

    def render(self) -> str:
        options = "kw_only=True"
        if self.tag:
            options += f', tag_field="{self.tag[0]}", tag="{self.tag[1]}"'
        lines = [f"class {self.name}({self.base}, {options}):"]
        if self.doc:
            lines.append(f'    """{self.doc}"""')
        lines.extend(field.render() for field in self.fields)
        if len(lines) == 1:
            lines.append("    pass")
        return "\n".join(lines)


class Alias:
    def __init__(self, name: str, runtime: str, typed: Optional[str] = None, deps: Tuple[str, ...] = ()):
        self.name = name
        self.runtime = runtime
        self.typed = typed  # what type checkers see, when it differs from the runtime value
        self.deps = deps

    def render(self) -> str:
        if self.typed is None:
            return f"{self.name} = {self.runtime}"
        return f"if TYPE_CHECKING:\n    {self.name} = {self.typed}\nelse:\n    {self.name} = {self.runtime}"


class Generator:
    def __init__(self, schema: Dict[str, Any]):
        self.defs: Dict[str, Dict[str, Any]] = schema.get("$defs", {})
        self.refcount: Counter = Counter()
        _count_refs(schema, self.refcount)
        self.scalars: List[Alias] = []  # aliases that depend on no class
        self.structs: Dict[str, StructSpec] = {}
        self.variants: List[StructSpec] = []  # classes made for union variants, after the defs
        self.unions: List[Alias] = []
        # def name -> (its tag, the owning union's own properties and required list, the union's
        # name) for the defs that a tagged union turns into one of its variants
        self.owned: Dict[str, Tuple[Optional[Tuple[str, str]], Dict[str, Any], List[str], str]] = {}
        self.taken = set(self.defs)
        self.bounded: Dict[str, Alias] = {}  # private bounded-int aliases, emitted first

    # ----- annotations -------------------------------------------------------------------

    def annotation(self, node: Dict[str, Any], owner: str, prop: str) -> str:
        """The Python annotation for a property schema (without the leniency markers)."""
        ref = _ref_name(node)
        if ref is not None:
            return ref
        if "anyOf" in node or "oneOf" in node:
            alts = _alternatives(node)
            nullable = any(_is_null(a) for a in alts)
            rest = [a for a in alts if not _is_null(a)]
            inner = self.union_annotation(rest, f"_{owner}{pascal(prop)}")
            return f"Optional[{inner}]" if nullable and inner != "Any" else inner
        types = node.get("type")
        if isinstance(types, list):
            nullable = "null" in types
            rest = [t for t in types if t != "null"]
            if len(rest) != 1:
                return "Any"
            inner = self.annotation(dict(node, type=rest[0]), owner, prop)
            return f"Optional[{inner}]" if nullable and inner != "Any" else inner
        if "const" in node:
            return f"Literal[{json.dumps(node['const'])}]"
        if "enum" in node:
            return "Literal[" + ", ".join(json.dumps(v) for v in node["enum"]) + "]"
        if types == "integer":
            return self.integer(node)
        if types in _SCALARS:
            return _SCALARS[types]
        if types == "array":
            items = node.get("items")
            return f"List[{self.annotation(items, owner, prop) if isinstance(items, dict) else 'Any'}]"
        if types == "object" or "properties" in node:
            if node.get("properties"):
                name = self.unique(f"{owner}{pascal(prop)}")
                self.variants.append(
                    StructSpec(name, self.fields(node, name), doc=f"The ``{prop}`` object of ``{owner}``.")
                )
                return name
            extra = node.get("additionalProperties")
            value = self.annotation(extra, owner, prop) if isinstance(extra, dict) else "Any"
            return f"Dict[str, {value}]"
        return "Any"

    def integer(self, node: Dict[str, Any]) -> str:
        """``int``, or a private alias carrying the bounds (``_Uint32``) when the schema sets some."""
        fmt = node.get("format", "")
        low, high = _INT_FORMATS.get(fmt, (None, None))
        low = node.get("minimum", low)
        high = node.get("maximum", high)
        bounds = []
        if low is not None and low > -(2**63):
            bounds.append(f"ge={low}")
        if high is not None and high < 2**64 - 1 and high != 2**63 - 1:
            bounds.append(f"le={high}")
        if not bounds:
            return "int"
        name = (
            f"_{pascal(fmt)}"
            if (low, high) == _INT_FORMATS.get(fmt)
            else f"_Int{'_'.join(bounds)}".replace("=", "").replace("-", "m")
        )
        if name not in self.bounded:
            self.bounded[name] = Alias(name, f"Annotated[int, msgspec.Meta({', '.join(bounds)})]")
        return name

    def union_annotation(self, alts: List[Dict[str, Any]], synthetic: str) -> str:
        """A union of (non-null) alternatives found inside a property."""
        if not alts:
            return "Any"
        if len(alts) == 1:
            return self.annotation(alts[0], synthetic, "")
        name = self.unique(synthetic)
        self.build_union(name, alts, {}, [])
        return name

    def unique(self, name: str) -> str:
        candidate, n = name, 2
        while candidate in self.taken:
            candidate, n = f"{name}{n}", n + 1
        self.taken.add(candidate)
        return candidate

    # ----- fields ------------------------------------------------------------------------

    def fields(self, node: Dict[str, Any], owner: str, optional_all: bool = False) -> List[Field]:
        required = set(node.get("required", []))
        result = []
        for json_name, prop in node.get("properties", {}).items():
            prop = prop if isinstance(prop, dict) else {}
            annotation = self.annotation(prop, owner, json_name)
            is_required = json_name in required and not optional_all
            if not is_required and annotation != "Any" and not annotation.startswith("Optional["):
                annotation = f"Optional[{annotation}]"
            markers = [m for m in (DEFAULT_ON_ERROR, SKIP_INVALID_ITEMS) if prop.get(m)]
            if markers:
                constant = "_SKIP_INVALID_ITEMS" if SKIP_INVALID_ITEMS in markers else "_DEFAULT_ON_ERROR"
                annotation = f"Annotated[{annotation}, {constant}]"
            result.append(Field(json_name, annotation, is_required))
        return result

    @staticmethod
    def ordered(groups: List[List[Field]]) -> List[Field]:
        """Concatenate field groups, first occurrence wins, ``_meta`` last."""
        seen, result, tail = set(), [], []
        for group in groups:
            for field in group:
                if field.json_name in seen:
                    continue
                seen.add(field.json_name)
                (tail if field.json_name == "_meta" else result).append(field)
        if len({f.attr for f in result + tail}) != len(result + tail):
            raise SchemaShapeError(f"two properties map to one attribute name: {[f.json_name for f in result + tail]}")
        return result + tail

    # ----- defs --------------------------------------------------------------------------

    def run(self) -> None:
        self.plan_ownership()
        for name, node in self.defs.items():
            self.define(name, node)

    def plan_ownership(self) -> None:
        """Find the defs that become a tagged variant of the one union referring to them."""
        for name, node in self.defs.items():
            alts = _alternatives(node)
            if not any(_tag_of(a) for a in alts):
                continue
            base = node.get("properties", {}) if _is_object(node) else {}
            for alt in alts:
                ref = _ref_name(alt)
                inline = {
                    k: v for k, v in alt.get("properties", {}).items() if not (_tag_of(alt) and k == _tag_of(alt)[0])
                }
                if (
                    ref
                    and not inline
                    and self.refcount[ref] == 1
                    and _is_object(self.defs.get(ref, {}))
                    and not _is_catch_all(alt)
                ):
                    self.owned[ref] = (_tag_of(alt), base, list(node.get("required", [])), name)

    def define(self, name: str, node: Dict[str, Any]) -> None:
        alts = _alternatives(node)
        if _is_object(node) and name in self.owned:
            tag, base, base_required, union = self.owned[name]
            what = f"The ``{tag[1]}`` variant of ``{union}``." if tag else ""
            fields = self.ordered(
                [
                    self.fields(_shared_part(base, base_required, tag), name),
                    self.fields(node, name),
                    self.mixin_fields(node, alts, name),
                ]
            )
            self.structs[name] = StructSpec(name, fields, tag=tag, doc=what)
        elif _is_object(node) and any(_tag_of(a) for a in alts):
            self.build_union(name, alts, node.get("properties", {}), node.get("required", []))
        elif _is_object(node):
            fields = self.ordered([self.fields(node, name), self.mixin_fields(node, alts, name)])
            self.structs[name] = StructSpec(name, fields)
        elif alts:
            self.define_union_def(name, alts)
        else:
            annotation = self.annotation(node, name, "")
            self.add_scalar(name, annotation)

    def mixin_fields(self, node: Dict[str, Any], alts: List[Dict[str, Any]], owner: str) -> List[Field]:
        """Alternatives without a discriminator merged in as optional fields."""
        groups = []
        for alt in alts:
            ref = _ref_name(alt)
            target = self.defs.get(ref, {}) if ref else alt
            groups.append(self.fields(target, owner, optional_all=True))
        return [f for group in groups for f in group]

    def add_scalar(self, name: str, annotation: str) -> None:
        if name in FALLBACKS:
            marker = f'msgspec.Meta(extra={{"{FALLBACK}": {json.dumps(FALLBACKS[name])}}})'
            annotation = f"Annotated[{annotation}, {marker}]"
        deps = tuple(word for word in re.findall(r"\w+", annotation) if word in self.taken)
        # An alias naming a class must come after the classes; the others come first.
        (self.unions if deps else self.scalars).append(Alias(name, annotation, deps=deps))

    def define_union_def(self, name: str, alts: List[Dict[str, Any]]) -> None:
        nullable = any(_is_null(a) for a in alts)
        rest = [a for a in alts if not _is_null(a)]
        consts = [a for a in rest if "const" in a]
        if consts and all("const" in a or a.get("type") == consts[0].get("type") for a in rest):
            open_set = len(consts) < len(rest)
            if open_set:
                annotation = self.annotation({"type": consts[0]["type"]}, name, "")
            else:
                annotation = "Literal[" + ", ".join(json.dumps(a["const"]) for a in consts) + "]"
            self.add_scalar(name, f"Optional[{annotation}]" if nullable else annotation)
            return
        if len(rest) == 1 and not any(_tag_of(a) for a in rest):
            annotation = self.annotation(rest[0], name, "")
            if nullable:
                annotation = f"Optional[{annotation}]"
            self.unions.append(Alias(name, annotation, deps=tuple(re.findall(r"\w+", annotation))))
            return
        self.build_union(name, alts, {}, [])

    def build_union(
        self, name: str, alts: List[Dict[str, Any]], base: Dict[str, Any], base_required: List[str]
    ) -> None:
        """Define ``name`` as the union of ``alts``; ``base`` holds properties every variant shares."""
        nullable = any(_is_null(a) for a in alts)
        members: List[str] = []
        titles: List[Tuple[str, str]] = []  # (title, member) of the alternatives without a tag
        tagged = False
        for alt in alts:
            if _is_null(alt) or _is_catch_all(alt):
                continue
            tag = _tag_of(alt)
            tagged = tagged or tag is not None
            members.append(self.variant(name, alt, tag, base, base_required))
            if tag is None and "title" in alt:
                titles.append((alt["title"], members[-1]))
        structs = [m for m in members if self.is_struct(m)]
        untagged = [m for m in members if self.tag_of_class(m) is None]
        if tagged and not untagged:
            runtime = f"Union[{', '.join(members)}]"
        elif self.native_ok(members, structs):
            runtime = f"Union[{', '.join(members)}]" if len(members) > 1 else members[0]
        else:
            # Beside tagged siblings, an untagged alternative's title is the tag it may also carry.
            implied = ", ".join(f'"{title}": {member}' for title, member in titles) if tagged else ""
            tag_fields = {tag[0] for tag in map(_tag_of, alts) if tag}
            # The schema puts no constraint on the tag of an untagged member whose def lacks it.
            other = [
                member
                for _, member in titles
                if tagged and not tag_fields & set(self.defs.get(member, {}).get("properties", {}))
            ]
            runtime = (
                f'untagged_union("{name}", {", ".join(members)}'
                + (f", implied={{{implied}}}" if implied else "")
                + (f", other={other[0]}" if len(other) == 1 else "")
                + ")"
            )
        typed_members = members + (["UnknownVariant"] if tagged else [])
        typed = f"Union[{', '.join(typed_members)}]" if len(typed_members) > 1 else typed_members[0]
        if nullable:
            runtime, typed = f"Optional[{runtime}]", f"Optional[{typed}]"
        self.unions.append(Alias(name, runtime, typed if typed != runtime else None, deps=tuple(members)))

    def native_ok(self, members: List[str], structs: List[str]) -> bool:
        """Whether msgspec can tell the members apart by JSON type alone."""
        kinds = []
        for member in members:
            if member in structs or member.startswith("Dict["):
                kinds.append("object")
            elif member.startswith("List["):
                kinds.append("array")
            else:
                kinds.append(member)
        return len(kinds) == len(set(kinds))

    def is_struct(self, name: str) -> bool:
        node = self.defs.get(name)
        if node is not None:
            return _is_object(node) and not (name not in self.owned and any(_tag_of(a) for a in _alternatives(node)))
        return any(v.name == name for v in self.variants)

    def tag_of_class(self, name: str) -> Optional[Tuple[str, str]]:
        if name in self.owned:
            return self.owned[name][0]
        spec = self.structs.get(name) or next((v for v in self.variants if v.name == name), None)
        return spec.tag if spec else None

    def variant(
        self,
        union: str,
        alt: Dict[str, Any],
        tag: Optional[Tuple[str, str]],
        base: Dict[str, Any],
        base_required: List[str],
    ) -> str:
        """The class name standing for one alternative of ``union`` (made when needed)."""
        ref = _ref_name(alt)
        inline = {k: v for k, v in alt.get("properties", {}).items() if not (tag and k == tag[0])}
        if ref and ref in self.owned and self.owned[ref][3] == union:
            return ref
        if not _is_object(alt) and not ref:
            return self.annotation(alt, union, alt.get("title", ""))
        if ref and not tag and not base and not inline:
            return ref
        if ref and tag and self.is_tagged_union(ref):
            return self.flattened_variant(union, ref, tag, base, base_required)
        if ref and not _is_object(self.defs.get(ref, {})):
            return ref
        label = tag[1] if tag else alt.get("title", "variant")
        if ref and not base and not inline:
            name = pascal(label)
            name = self.unique(name if name not in self.taken else union + pascal(label))
            self.variants.append(
                StructSpec(
                    name, [], base=ref, tag=tag, doc=f"The ``{label}`` variant of ``{union}``, shaped as ``{ref}``."
                )
            )
            return name
        name = self.unique(union + pascal(label))
        groups = [self.fields(_shared_part(base, base_required, tag), name)]
        if ref:
            groups.append(self.fields(self.defs[ref], name))
        groups.append(self.fields({"properties": inline, "required": alt.get("required", [])}, name))
        doc = f"The ``{label}`` variant of ``{union}``." if tag else f"The ``{label}`` form of ``{union}`` (no tag)."
        self.variants.append(StructSpec(name, self.ordered(groups), tag=tag, doc=doc))
        return name

    def is_tagged_union(self, name: str) -> bool:
        node = self.defs.get(name, {})
        return not _is_object(node) and any(_tag_of(a) for a in _alternatives(node))

    def flattened_variant(
        self, union: str, ref: str, tag: Tuple[str, str], base: Dict[str, Any], base_required: List[str]
    ) -> str:
        """A tagged variant whose payload is itself a union tagged by another property
        (``state_update`` holding ``running``/``idle``/...): msgspec reads one tag per class, so
        the variant is one class holding the inner tag as a required field and the inner
        variants' properties as optional ones."""
        inner = [a for a in _alternatives(self.defs[ref]) if not _is_null(a)]
        inner_field = next(_tag_of(a) for a in inner if _tag_of(a))[0]
        known = [_tag_of(a)[1] for a in inner if _tag_of(a)]
        open_set = any(_is_catch_all(a) for a in inner)
        annotation = "str" if open_set else "Literal[" + ", ".join(json.dumps(v) for v in known) + "]"
        name = self.unique(union + pascal(tag[1]))
        groups = [self.fields(_shared_part(base, base_required, tag), name), [Field(inner_field, annotation, True)]]
        for alt in inner:
            if _is_catch_all(alt):
                continue
            target = self.defs.get(_ref_name(alt) or "", alt)
            props = {k: v for k, v in target.get("properties", {}).items() if k != inner_field}
            groups.append(self.fields({"properties": props}, name, optional_all=True))
            groups.append(self.mixin_fields(target, _alternatives(target), name))
        doc = (
            f"The ``{tag[1]}`` variant of ``{union}``: the variants of ``{ref}`` (told apart by "
            f"``{inner_field}``) in one class."
        )
        self.variants.append(StructSpec(name, self.ordered(groups), tag=tag, doc=doc))
        return name

    # ----- output ------------------------------------------------------------------------

    def ordered_unions(self) -> List[Alias]:
        done, result = set(), []
        pending = list(self.unions)
        names = {u.name for u in pending}
        while pending:
            progressed = False
            for alias in list(pending):
                if all(d not in names or d in done or d == alias.name for d in alias.deps):
                    result.append(alias)
                    done.add(alias.name)
                    pending.remove(alias)
                    progressed = True
            if not progressed:
                raise SchemaShapeError(f"unions refer to each other in a cycle: {[a.name for a in pending]}")
        return result


def method_tables(
    defs: Dict[str, Dict[str, Any]], meta: Dict[str, Any]
) -> Dict[str, List[Tuple[str, str, Optional[str]]]]:
    """side -> [(method, params type, result type or None)] from ``x-method``/``x-side``, in the
    order of the method table ``meta``, which must name exactly the same methods."""
    results = set()

    def collect(node: Any) -> None:
        # JSON-RPC puts a method's answer under "result": every def referred to there is a result type.
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict) and isinstance(props.get("result"), dict):
                counts: Counter = Counter()
                _count_refs(props["result"], counts)
                results.update(counts)
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    collect(defs)
    by_method: Dict[Tuple[str, str], Dict[str, Optional[str]]] = {}
    for name, node in defs.items():
        method, side = node.get("x-method"), node.get("x-side")
        if not method or not side:
            continue
        entry = by_method.setdefault((side, method), {"params": None, "result": None})
        entry["result" if name in results else "params"] = name
    tables: Dict[str, List[Tuple[str, str, Optional[str]]]] = {}
    for (side, method), entry in by_method.items():
        if entry["params"] is None:
            raise SchemaShapeError(f"method {method} has a result type but no params type")
        tables.setdefault(side, []).append((method, entry["params"], entry["result"]))
    for side, key in (("agent", "agentMethods"), ("client", "clientMethods"), ("protocol", "protocolMethods")):
        listed = list(meta.get(key, {}).values())
        found = [m for m, _, _ in tables.get(side, [])]
        if sorted(listed) != sorted(found):
            raise SchemaShapeError(
                f"{key} in the method table {sorted(listed)} differ from the schema's {sorted(found)}"
            )
        tables[side] = sorted(tables.get(side, []), key=lambda entry: listed.index(entry[0]))
    return tables


HEADER = '''\
# GENERATED by schema/generate.py from {source} (upstream schema sha256 {digest}) -- do not edit.
"""The typed model of the Agent Client Protocol: one name per definition of the JSON Schema.

Objects are ``msgspec.Struct`` classes with snake_case attributes that encode to the protocol's
exact JSON names; optional properties default to ``None`` and are left out of the output when
``None``. Tagged unions decode by their discriminator. A union that may carry a tag unknown to
this version lists ``UnknownVariant`` among its members for type checkers: ``acp_lite.codec``
produces one when a newer peer sends such a tag. Decode and encode with ``acp_lite.codec``, which
also honours the leniency markers carried in ``msgspec.Meta(extra=...)``.

``AGENT_METHODS`` are the methods an agent handles, ``CLIENT_METHODS`` those a client handles and
``PROTOCOL_METHODS`` those both sides handle; a ``MethodSpec`` whose ``result_type`` is ``None``
is a notification.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Dict, List, Literal, Optional, Union

import msgspec

from {codec} import MethodSpec, UnknownVariant, untagged_union

'''


def render(
    gen: Generator,
    source: str,
    digest: str,
    tables: Dict[str, List[Tuple[str, str, Optional[str]]]],
    version: int,
    codec: str = ".codec",
) -> str:
    parts = [HEADER.format(source=source, digest=digest, codec=codec), f"PROTOCOL_VERSION = {version}\n\n"]
    parts.append(
        "# Leniency markers read by acp_lite.codec: a malformed value falls back to the field's default,\n"
        "# and a malformed item of an array is dropped.\n"
        f'_DEFAULT_ON_ERROR = msgspec.Meta(extra={{"{DEFAULT_ON_ERROR}": True}})\n'
        f'_SKIP_INVALID_ITEMS = msgspec.Meta(extra={{"{DEFAULT_ON_ERROR}": True, "{SKIP_INVALID_ITEMS}": True}})\n'
    )
    parts.append(
        "\n\nclass _SchemaStruct(msgspec.Struct, omit_defaults=True, repr_omit_defaults=True, gc=False):\n"
        '    """Common configuration of every protocol object.\n\n'
        "    ``gc=False``: decoded protocol values hold no reference cycles, and leaving them out of the\n"
        "    garbage collector's tracking halved decode time when many of them stay alive (measured).\n"
        "    Do not build reference cycles through them.\n"
        '    """\n\n'
    )
    scalars = sorted(gen.bounded.values(), key=lambda a: a.name) + gen.scalars
    parts.append("\n" + "\n".join(alias.render() for alias in scalars) + "\n")
    for spec in list(gen.structs.values()) + gen.variants:
        parts.append("\n\n" + spec.render() + "\n")
    parts.append("\n\n" + "\n".join(alias.render() for alias in gen.ordered_unions()) + "\n")
    for side, constant in (("agent", "AGENT_METHODS"), ("client", "CLIENT_METHODS"), ("protocol", "PROTOCOL_METHODS")):
        rows = "".join(f'    "{m}": MethodSpec("{m}", {p}, {r or "None"}),\n' for m, p, r in tables.get(side, []))
        parts.append(f"\n{constant}: Dict[str, MethodSpec] = {{\n{rows}}}\n")
    public = sorted(
        {a.name for a in gen.scalars}
        | set(gen.structs)
        | {v.name for v in gen.variants if not v.name.startswith("_")}
        | {u.name for u in gen.unions if not u.name.startswith("_")}
    )
    public += ["AGENT_METHODS", "CLIENT_METHODS", "PROTOCOL_METHODS", "PROTOCOL_VERSION"]
    parts.append("\n__all__ = [\n" + "".join(f'    "{n}",\n' for n in public) + "]\n")
    return "".join(parts)


def generate(structure_path: str, codec: str = ".codec") -> str:
    with open(structure_path, encoding="utf-8") as f:
        schema = json.load(f)
    meta = schema["x-acp-lite-methods"]
    gen = Generator(schema)
    gen.run()
    tables = method_tables(gen.defs, meta)
    source = os.path.relpath(structure_path).replace(os.sep, "/")
    return render(gen, source, schema["x-acp-lite-derived"]["schema_sha256"], tables, meta["version"], codec)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Generate acp_lite/schema.py from a structure file of schema/.")
    parser.add_argument("structure", help="the structure file made by schema/derive.py (schema/v1/structure.json)")
    parser.add_argument("--out", required=True, help="where to write the module")
    parser.add_argument(
        "--codec",
        default=".codec",
        help="the module the output imports acp_lite.codec as, relative to the output (..codec in a subpackage)",
    )
    args = parser.parse_args(argv)
    text = generate(args.structure, args.codec)
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
