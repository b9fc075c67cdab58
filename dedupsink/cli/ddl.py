"""A Spark DDL schema string (``id BIGINT, ts TIMESTAMP``) parsed without starting Spark.

Spark's own parser lives in the JVM; this one covers the DDL a streaming source schema uses
(every atomic type, ``DECIMAL(p, s)``, ``CHAR``/``VARCHAR`` (read as ``STRING``, as Spark's
streaming sources do), ``ARRAY<>``, ``MAP<>``, ``STRUCT<>``, back-quoted names, ``NOT NULL``
and ``COMMENT '...'``) and returns pyspark's own ``StructType``, which the CLI hands to the
source, so ``validate`` and ``run`` see exactly the same schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from dedupsink.errors import ConfigError

__all__ = ["parse_schema"]

_ATOMIC: dict[str, type[DataType]] = {
    "boolean": BooleanType,
    "tinyint": ByteType,
    "byte": ByteType,
    "smallint": ShortType,
    "short": ShortType,
    "int": IntegerType,
    "integer": IntegerType,
    "bigint": LongType,
    "long": LongType,
    "float": FloatType,
    "real": FloatType,
    "double": DoubleType,
    "string": StringType,
    "binary": BinaryType,
    "date": DateType,
    "timestamp": TimestampType,
    "timestamp_ltz": TimestampType,
    "timestamp_ntz": TimestampNTZType,
}
_TEXT_WITH_LENGTH = ("char", "varchar", "character")
_DECIMAL = ("decimal", "dec", "numeric")
_TOKEN = re.compile(
    r"\s*(?:(?P<quoted>`(?:[^`]|``)*`)|(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<number>\d+)"
    r"|(?P<text>'(?:[^'\\]|\\.)*')|(?P<punct>[<>(),:]))"
)
ACCEPTED = (
    "a Spark DDL schema such as 'id BIGINT, name STRING, ts TIMESTAMP' (types: "
    + ", ".join(sorted({*_ATOMIC, *_DECIMAL[:1], *_TEXT_WITH_LENGTH[:2]}))
    + ", array<..>, map<..,..>, struct<..>)"
)


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    position: int


def _tokens(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    position = 0
    while position < len(text):
        if text[position:].strip() == "":
            break
        match = _TOKEN.match(text, position)
        if match is None or match.lastgroup is None:
            stripped = len(text[position:]) - len(text[position:].lstrip())
            raise _Problem(
                position + stripped, f"unexpected character {text[position:].strip()[0]!r}"
            )
        kind = match.lastgroup
        tokens.append(_Token(kind, match.group(kind), match.start(kind)))
        position = match.end()
    return tokens


class _Problem(Exception):
    """A parse failure at a position (turned into a ConfigError by ``parse_schema``)."""

    def __init__(self, position: int, message: str) -> None:
        self.position = position
        super().__init__(message)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.index = 0

    def peek(self) -> _Token | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self) -> _Token:
        token = self.peek()
        if token is None:
            raise _Problem(len(self.text), "the schema ends too early")
        self.index += 1
        return token

    def expect(self, punct: str) -> None:
        token = self.take()
        if token.text != punct:
            raise _Problem(token.position, f"expected {punct!r}, found {token.text!r}")

    def accept(self, punct: str) -> bool:
        token = self.peek()
        if token is not None and token.kind == "punct" and token.text == punct:
            self.index += 1
            return True
        return False

    def accept_word(self, word: str) -> bool:
        token = self.peek()
        if token is not None and token.kind == "word" and token.text.lower() == word:
            self.index += 1
            return True
        return False

    def number(self) -> int:
        token = self.take()
        if token.kind != "number":
            raise _Problem(token.position, f"expected a number, found {token.text!r}")
        return int(token.text)

    def name(self) -> str:
        token = self.take()
        if token.kind == "quoted":
            return token.text[1:-1].replace("``", "`")
        if token.kind == "word":
            return token.text
        raise _Problem(token.position, f"expected a column name, found {token.text!r}")

    def fields(self, closing: str | None) -> StructType:
        fields: list[StructField] = []
        while True:
            name = self.name()
            self.accept(":")
            kind = self.data_type()
            nullable = not (self.accept_word("not") and self._require_word("null"))
            if self.accept_word("comment"):
                token = self.take()
                if token.kind != "text":
                    raise _Problem(token.position, "expected a quoted comment after COMMENT")
            fields.append(StructField(name, kind, nullable))
            if not self.accept(","):
                break
        if closing is not None:
            self.expect(closing)
        return StructType(fields)

    def _require_word(self, word: str) -> bool:
        if not self.accept_word(word):
            token = self.peek()
            found = token.text if token else "the end"
            raise _Problem(
                token.position if token else len(self.text),
                f"expected {word.upper()}, found {found!r}",
            )
        return True

    def data_type(self) -> DataType:
        token = self.take()
        word = token.text.lower()
        if token.kind != "word":
            raise _Problem(token.position, f"expected a type, found {token.text!r}")
        if word in _ATOMIC:
            return _ATOMIC[word]()
        if word in _DECIMAL:
            return self._decimal()
        if word in _TEXT_WITH_LENGTH:
            self.expect("(")
            self.number()
            self.expect(")")
            return StringType()
        if word == "array":
            self.expect("<")
            element = self.data_type()
            self.expect(">")
            return ArrayType(element, True)
        if word == "map":
            self.expect("<")
            key = self.data_type()
            self.expect(",")
            value = self.data_type()
            self.expect(">")
            return MapType(key, value, True)
        if word == "struct":
            self.expect("<")
            if self.accept(">"):
                return StructType([])
            return self.fields(">")
        raise _Problem(token.position, f"unknown type {token.text!r}")

    def _decimal(self) -> DecimalType:
        if not self.accept("("):
            return DecimalType(10, 0)
        precision = self.number()
        scale = self.number() if self.accept(",") else 0
        self.expect(")")
        if not 1 <= precision <= 38 or scale > precision:
            raise _Problem(
                0, f"DECIMAL({precision},{scale}) needs 1 <= precision <= 38 and scale <= precision"
            )
        return DecimalType(precision, scale)


def parse_schema(text: str, key: str = "source.schema", where: str | None = None) -> StructType:
    """Parse a DDL schema; a ConfigError names ``key`` and the position of the problem."""
    try:
        parser = _Parser(text)
        if not parser.tokens:
            raise _Problem(0, "the schema is empty")
        schema = parser.fields(None)
        leftover = parser.peek()
        if leftover is not None:
            raise _Problem(leftover.position, f"unexpected {leftover.text!r}")
    except _Problem as problem:
        raise ConfigError(
            key,
            f"{key}={text!r} is invalid at character {problem.position + 1}: {problem}; "
            f"expected {ACCEPTED}",
            where,
        ) from problem
    names = [field.name.lower() for field in schema.fields]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(key, f"{key} names column(s) {', '.join(repeated)} more than once", where)
    return schema
