"""The DBMS vocabulary's one table (tierscope.contracts.dbms) and the names the spec and the
services derive from it."""

from __future__ import annotations

import pytest

from tierscope.contracts import dbms
from tierscope.contracts.dbms import DbConfig
from tierscope.services import databases
from tierscope.spec import notation


def test_a_dbms_is_found_by_its_services_name_and_by_its_spec_name():
    assert dbms.dbms("postgres") is dbms.dbms("postgresql") is dbms.BY_NAME["postgresql"]
    assert dbms.dbms("galera").protocol == "mysql" and dbms.dbms("galera").data == "mariadb"
    with pytest.raises(ValueError, match="expected one of postgresql, mariadb, galera, got 'oracle'"):
        dbms.dbms("oracle")


def test_the_spec_and_the_services_take_their_names_from_the_table():
    assert notation.DBMS == {"P": "postgres", "M": "mariadb", "G": "galera"}
    assert databases.PORT == {"postgresql": 5432, "mariadb": 3306, "galera": 3306}
    assert databases.PROTOCOL == {"postgresql": "postgres", "mariadb": "mysql", "galera": "mysql"}
    assert [databases.dbms_name(n) for n in ("postgres", "postgresql", "mariadb", "galera", "x")] == [
        "postgresql",
        "postgresql",
        "mariadb",
        "galera",
        "x",
    ]


def test_a_client_connects_to_one_dbms_per_wire_protocol():
    assert dbms.CLIENT_NAMES == ("postgresql", "mariadb")
    assert DbConfig("mariadb", port=3306).port == 3306
    with pytest.raises(ValueError, match="dbms: expected one of"):
        DbConfig("galera")  # a Galera node is reached as MariaDB
    with pytest.raises(ValueError, match="pool_size: expected >= 1"):
        DbConfig(pool_size=0)
