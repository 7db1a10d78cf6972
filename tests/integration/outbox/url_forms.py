"""Every database URL form the docs write, built on the test servers' hosts, and a sender
for `reliable worker resend --sender url_forms:accepting`."""

from __future__ import annotations

import itertools

from sqlalchemy import make_url

from reliable import Message, SendReceipt, SendStatus
from tests.conftest import MARIADB_URL, POSTGRES_URL


def _forms(url: str, schemes: tuple[str, ...]) -> list[str]:
    base = make_url(url)
    return [base.set(drivername=s).render_as_string(hide_password=False) for s in schemes]


POSTGRES_FORMS = _forms(POSTGRES_URL, ("postgresql", "postgres", "postgresql+psycopg2"))
MARIADB_FORMS = _forms(MARIADB_URL, ("mysql", "mysql+pymysql", "mariadb", "mariadb+pymysql"))


class Accepting:
    """A sender whose every send is stored (queue 0, offsets counting up)."""

    _offsets = itertools.count()

    def send(self, message: Message) -> SendReceipt:
        offset = next(self._offsets)
        return SendReceipt(
            message_id=message.message_id or "",
            status=SendStatus.SEND_OK,
            topic=message.topic,
            queue_id=0,
            queue_offset=offset,
            offset_msg_id=f"{offset:032X}",
        )


def accepting() -> Accepting:
    return Accepting()
