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


def test_the_spec_and_the_lab_service_take_the_middlewares_contract(tmp_path):
    """The policies, waits and defaults the spec accepts and the lab's service passes are the
    middleware's contract's (contracts/middleware.json; cargo test holds the engine to it)."""
    from tierscope.contracts import middleware as contract
    from tierscope.services.middleware import Middleware
    from tierscope.spec.model import MiddlewareSoft
    from tierscope.testbed.host import Host

    assert contract.POLICIES == ("lprf", "rr", "wrr", "lrt", "aware") and sorted(contract.WEIGHTED_POLICIES) == ["wrr"]
    soft = MiddlewareSoft()
    assert (soft.policy, soft.wait, soft.pool) == tuple(contract.DEFAULTS[k] for k in ("policy", "wait", "pool"))
    for policy in contract.POLICIES:
        assert MiddlewareSoft(policy=policy).policy == policy
        weights = [1.0, 2.0] if policy in contract.WEIGHTED_POLICIES else None
        svc = Middleware(
            Host.loopback("mw1"),
            25322,
            tmp_path / "mw1",
            backends=["127.0.0.1:5433", "127.0.0.1:5434"],
            user="u",
            password="p",
            policy=policy,
            weights=weights,
            dbms="galera",
        )
        argv = svc.command()
        assert argv[argv.index("--policy") + 1] == policy and argv[argv.index("--protocol") + 1] == "mysql"
        assert svc.dbms == "mariadb"  # Galera's client is MariaDB's
    with pytest.raises(ValueError, match="Input should be 'lprf', 'rr', 'wrr', 'lrt' or 'aware'"):
        MiddlewareSoft(policy="random")
    with pytest.raises(ValueError, match="Input should be 'first' or 'all'"):
        MiddlewareSoft(wait="some")
    for wrong in ({"policy": "lprf", "weights": [1.0, 1.0]}, {"dbms": "oracle"}):
        with pytest.raises(ValueError, match="weights: only with policy wrr|dbms: expected one of postgresql"):
            Middleware(Host.loopback("mw1"), 25322, tmp_path / "mw2", backends=["127.0.0.1:5433"] * 2, **wrong)
