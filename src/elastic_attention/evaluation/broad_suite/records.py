"""Generated structured haystacks: tables of records (CSV, markdown, JSON Lines, a JSON array) and server logs.

A :class:`Schema` draws records (one key column of unique-looking ids, the others plain values); a :class:`Table`
writes them in one format, a :class:`Log` writes log events in one of four line styles. Both are used twice: as a
haystack's filler and, by the lookup families, to write the one record or line a question asks about in exactly the
haystack's own format.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from elastic_attention.evaluation.broad_suite.vocabulary import CITIES, FIRST_NAMES, LAST_NAMES, long_words
from elastic_attention.evaluation.seeded_random import SampleRandom

TABLE_FORMATS = ("csv", "markdown", "jsonl", "json_array")
LOG_STYLES = ("classic", "logfmt", "syslog", "bracket")
_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


@dataclass(frozen=True)
class Column:
    """One column: its name, how a value is drawn, and whether JSON writes it as a number."""

    name: str
    draw: Callable[[SampleRandom], str]
    numeric: bool = False

    @property
    def phrase(self) -> str:
        """The column as a question names it (``unit_price`` -> ``unit price``)."""
        return self.name.replace("_", " ")


def _date(rng: SampleRandom) -> str:
    return f"{rng.integer(2015, 2030)}-{rng.integer(1, 12):02d}-{rng.integer(1, 28):02d}"


def _code(prefix: str, digits: int) -> Callable[[SampleRandom], str]:
    return lambda rng: f"{prefix}{rng.integer(10 ** (digits - 1), 10**digits - 1)}"


def _pick(options: tuple[str, ...]) -> Callable[[SampleRandom], str]:
    return lambda rng: rng.choice(options)


def _integer(low: int, high: int) -> Callable[[SampleRandom], str]:
    return lambda rng: str(rng.integer(low, high))


def _person(rng: SampleRandom) -> str:
    return f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"


def _word(rng: SampleRandom) -> str:
    return rng.choice(long_words())


def _price(rng: SampleRandom) -> str:
    return f"{rng.integer(1, 999)}.{rng.integer(0, 99):02d}"


def _note(rng: SampleRandom) -> str:
    """A free-text remark of 0-12 words (empty half the time): records then differ in length by a few tokens to a
    few dozen, so a context can be cut close to any length."""
    if rng.below(2):
        return ""
    return " ".join(rng.choice(long_words()) for _ in range(rng.integer(1, 12)))


def _sku(rng: SampleRandom) -> str:
    return f"{rng.choice(_LETTERS)}{rng.choice(_LETTERS)}-{rng.integer(10000, 99999)}"


@dataclass(frozen=True)
class Schema:
    """A kind of record.

    Attributes:
        name: the schema's name.
        noun: what one record is (``order``), for questions.
        columns: its columns; the first is the key (ids drawn from a large space), the last a free-text ``note``.
    """

    name: str
    noun: str
    columns: tuple[Column, ...]

    @property
    def key(self) -> Column:
        return self.columns[0]

    @property
    def askable(self) -> tuple[Column, ...]:
        """The columns a question may ask about: all but the key and the note."""
        return self.columns[1:-1]

    def draw(self, rng: SampleRandom) -> dict[str, str]:
        return {column.name: column.draw(rng) for column in self.columns}

    def column(self, name: str) -> Column:
        return next(column for column in self.columns if column.name == name)


_NOTE = Column("note", _note)
SCHEMAS: tuple[Schema, ...] = (
    Schema("orders", "order", (
        Column("order_id", _code("ORD-", 6)), Column("placed", _date), Column("customer", _person),
        Column("product", _word), Column("quantity", _integer(1, 60), True), Column("unit_price", _price, True),
        Column("status", _pick(("shipped", "pending", "cancelled", "delivered", "returned"))), _NOTE)),
    Schema("inventory", "item", (
        Column("sku", _sku), Column("item", _word), Column("warehouse", _pick(CITIES)),
        Column("stock", _integer(0, 5000), True), Column("reorder_level", _integer(5, 400), True),
        Column("updated", _date), _NOTE)),
    Schema("staff", "employee", (
        Column("employee_id", _code("E", 6)), Column("name", _person),
        Column("department", _pick(("finance", "research", "support", "legal", "logistics", "design"))),
        Column("office", _pick(CITIES)), Column("extension", _integer(1000, 9999), True),
        Column("start_date", _date), _NOTE)),
    Schema("sensors", "sensor", (
        Column("sensor_id", lambda rng: f"sn-{rng.integer(100000, 999999)}"), Column("site", _pick(CITIES)),
        Column("reading", lambda rng: f"{rng.integer(0, 400)}.{rng.integer(0, 9)}", True),
        Column("unit", _pick(("C", "kPa", "lux", "ppm", "dB"))), Column("battery", _integer(0, 100), True),
        Column("checked", _date), _NOTE)),
    Schema("tickets", "ticket", (
        Column("ticket", _code("TCK-", 5)), Column("opened", _date), Column("reporter", _person),
        Column("component", _word), Column("priority", _pick(("P1", "P2", "P3", "P4"))),
        Column("state", _pick(("open", "closed", "triaged", "blocked", "waiting"))), _NOTE)),
    Schema("shipments", "shipment", (
        Column("tracking", lambda rng: "1Z" + "".join(rng.choice(_LETTERS + "0123456789") for _ in range(10))),
        Column("origin", _pick(CITIES)), Column("destination", _pick(CITIES)),
        Column("weight_kg", _integer(1, 900), True),
        Column("carrier", _pick(("Northwind", "Bluefin", "Atlas", "Kestrel", "Meridian"))),
        Column("eta", _date), _NOTE)),
)


class Table:
    """Records of one schema written in one of `TABLE_FORMATS`."""

    def __init__(self, schema: Schema, fmt: str) -> None:
        if fmt not in TABLE_FORMATS:
            raise ValueError(f"unknown table format {fmt!r}")
        self.schema, self.fmt = schema, fmt

    def head(self) -> list[str]:
        """The lines before the first record (a header, a separator, an opening bracket)."""
        names = [column.name for column in self.schema.columns]
        if self.fmt == "csv":
            return [",".join(names) + "\n"]
        if self.fmt == "markdown":
            return ["| " + " | ".join(names) + " |\n", "|" + "|".join("---" for _ in names) + "|\n"]
        if self.fmt == "json_array":
            return ["[\n"]
        return []

    def render(self, record: dict[str, str]) -> str:
        """One record as one line of the table."""
        values = [record[column.name] for column in self.schema.columns]
        if self.fmt == "csv":
            return ",".join(f'"{value}"' if "," in value else value for value in values) + "\n"
        if self.fmt == "markdown":
            return "| " + " | ".join(values) + " |\n"
        typed = {column.name: (json.loads(record[column.name]) if column.numeric else record[column.name])
                 for column in self.schema.columns}
        line = json.dumps(typed)
        return f"  {line},\n" if self.fmt == "json_array" else line + "\n"


@dataclass(frozen=True)
class LogEvent:
    """A kind of log message.

    Attributes:
        component: the program part that writes it.
        message: the message with ``{field}`` slots.
        fields: each slot's draw.
        subject: how a question names one such line, with slots (``request {rid}``); empty: never asked about.
        asked: (field, phrase) pairs a question may ask (``("status", "status code")``).
    """

    component: str
    message: str
    fields: dict[str, Callable[[SampleRandom], str]]
    subject: str = ""
    asked: tuple[tuple[str, str], ...] = ()

    def draw(self, rng: SampleRandom) -> dict[str, str]:
        return {name: draw(rng) for name, draw in self.fields.items()}


def _hex(count: int) -> Callable[[SampleRandom], str]:
    return lambda rng: "".join(rng.choice("0123456789abcdef") for _ in range(count))


def _user(rng: SampleRandom) -> str:
    return f"{rng.choice(FIRST_NAMES).lower()}.{rng.choice(LAST_NAMES).lower()}{rng.integer(1, 99)}"


def _ip(rng: SampleRandom) -> str:
    return f"10.{rng.integer(0, 255)}.{rng.integer(0, 255)}.{rng.integer(1, 254)}"


LOG_EVENTS: tuple[LogEvent, ...] = (
    LogEvent("api", "{method} /api/{resource}/{item} -> {status} in {ms} ms (request {rid})",
             {"method": _pick(("GET", "POST", "PUT", "DELETE")), "resource": _word, "item": _integer(1, 9999),
              "status": _pick(("200", "201", "204", "301", "400", "403", "404", "409", "500", "503")),
              "ms": _integer(2, 2400), "rid": _hex(10)},
             "request {rid}", (("status", "status code"), ("ms", "response time in milliseconds"),
                               ("method", "HTTP method"))),
    LogEvent("auth", "user {user} signed in from {ip} using {agent}",
             {"user": _user, "ip": _ip, "agent": _pick(("firefox", "curl", "safari", "okhttp", "edge"))},
             "the sign-in of user {user}", (("ip", "IP address"), ("agent", "client program"))),
    LogEvent("scheduler", "job {job} finished with exit code {code} after {seconds} s",
             {"job": _code("job-", 6), "code": _integer(0, 137), "seconds": _integer(1, 86000)},
             "job {job}", (("code", "exit code"), ("seconds", "run time in seconds"))),
    LogEvent("billing", "payment {pid} of {amount} {currency} authorised for account {account}",
             {"pid": lambda rng: "pay_" + _hex(10)(rng), "amount": _price,
              "currency": _pick(("EUR", "USD", "JPY", "NOK", "CAD")), "account": _code("AC", 7)},
             "payment {pid}", (("amount", "amount"), ("currency", "currency"), ("account", "account"))),
    LogEvent("storage", "stored object {obj} ({size} bytes) in bucket {bucket}",
             {"obj": lambda rng: "obj-" + _hex(8)(rng), "size": _integer(100, 90_000_000), "bucket": _word},
             "object {obj}", (("size", "size in bytes"), ("bucket", "bucket"))),
    LogEvent("backup", "backup {bid} completed: {files} files, checksum {checksum}",
             {"bid": _code("bk", 7), "files": _integer(1, 250000), "checksum": _hex(12)},
             "backup {bid}", (("files", "number of files"), ("checksum", "checksum"))),
    LogEvent("cache", "cache miss for key {word}:{n}", {"word": _word, "n": _integer(1, 99999)}),
    LogEvent("net", "retrying connection to {host} (attempt {n})",
             {"host": lambda rng: f"{_word(rng)}.internal", "n": _integer(2, 9)}),
    LogEvent("worker", "queue {word} drained, {n} tasks left", {"word": _word, "n": _integer(0, 500)}),
)
ASKABLE_EVENTS = tuple(event for event in LOG_EVENTS if event.subject)


class Log:
    """Log lines in one of `LOG_STYLES`, on one day of a year drawn by the caller."""

    def __init__(self, style: str, day: tuple[int, int]) -> None:
        if style not in LOG_STYLES:
            raise ValueError(f"unknown log style {style!r}")
        self.style, (self.month, self.day) = style, day

    def render(self, rng: SampleRandom, event: LogEvent, values: dict[str, str], second: int) -> str:
        """One line of ``event`` with ``values`` at ``second`` seconds after midnight (ends with a newline)."""
        message = event.message.format(**values)
        level = "ERROR" if values.get("status", "").startswith("5") else rng.choice(("INFO", "INFO", "INFO",
                                                                                      "DEBUG", "WARN"))
        hours, minutes, seconds = second // 3600 % 24, second // 60 % 60, second % 60
        clock = f"{hours:02d}:{minutes:02d}:{seconds:02d}"
        date = f"2024-{self.month:02d}-{self.day:02d}"
        millis = rng.integer(0, 999)
        if self.style == "classic":
            return f"{date} {clock},{millis:03d} {level} [{event.component}] {message}\n"
        if self.style == "logfmt":
            quoted = message.replace('"', "'")
            return (f'ts={date}T{clock}.{millis:03d}Z level={level.lower()} component={event.component} '
                    f'msg="{quoted}"\n')
        if self.style == "syslog":
            return (f"{_MONTHS[self.month - 1]} {self.day:2d} {clock} node-{rng.integer(1, 9)} "
                    f"{event.component}[{rng.integer(100, 32000)}]: {message}\n")
        return f"[{date} {clock}] {event.component}.{level}: {message}\n"
