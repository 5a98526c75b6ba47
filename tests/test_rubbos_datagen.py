"""The RUBBoS data generator without a database: deterministic rows that respect what the
emulator and the pages assume (digest §3.4)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

import pytest

from tierscope.apps import bulkload
from tierscope.apps.rubbos import datagen

NOW = datetime(2026, 11, 22, 9, 30, 0)


def rows(gen: datagen.Generator) -> dict[str, list[list[str]]]:
    return {t: [line.split("\t") for line in it()] for t, it in gen.tables()}


@pytest.fixture(scope="module")
def tiny():
    return rows(datagen.Generator(datagen.PRESETS["tiny"], seed=42, now=NOW))


def test_same_seed_same_rows_other_seed_other_rows(tiny):
    again = rows(datagen.Generator(datagen.PRESETS["tiny"], seed=42, now=NOW))
    assert again == tiny
    other = rows(datagen.Generator(datagen.PRESETS["tiny"], seed=43, now=NOW))
    assert other["stories"] != tiny["stories"]
    assert len(other["users"]) == len(tiny["users"])


def test_users_and_authors_follow_the_emulators_names(tiny):
    sc = datagen.PRESETS["tiny"]
    users = tiny["users"]
    assert len(users) == sc.users + sc.authors
    by_nick = {u[3]: u for u in users}
    assert by_nick["user1"][4] == "password1" and by_nick["user1"][7] == "0"
    assert by_nick[f"user{sc.users}"][0] == str(sc.users)
    for i in (1, sc.authors):
        a = by_nick[f"author{i}"]
        assert a[4] == f"password{i}" and a[7] == "1"
    assert len(by_nick) == len(users)  # nicknames are unique
    assert all(len(u[3]) <= 20 and len(u[5]) <= 50 for u in users)


def test_comment_trees_have_consistent_childs(tiny):
    for table, story_table in (("comments", "stories"), ("old_comments", "old_stories")):
        comments = tiny[table]
        assert comments, table
        story_of = {int(c[0]): int(c[2]) for c in comments}
        replies = Counter(int(c[3]) for c in comments if c[3] != "0")
        story_ids = {int(s[0]) for s in tiny[story_table]}
        for c in comments:
            cid, story, parent, childs = int(c[0]), int(c[2]), int(c[3]), int(c[4])
            assert childs == replies.get(cid, 0), (table, cid)
            assert story in story_ids
            if parent:
                assert parent < cid and story_of[parent] == story  # earlier comment, same story
            assert -1 <= int(c[5]) <= 5
            assert 1 <= len(c[7]) <= 100 and len(c[8]) <= 1024
        assert sum(1 for c in comments if c[3] != "0") > 0  # there are real trees
        assert max(int(c[4]) for c in comments) >= 2


def test_dates_are_relative_to_the_load_time(tiny):
    new = [datetime.fromisoformat(s[3]) for s in tiny["stories"]]
    old = [datetime.fromisoformat(s[3]) for s in tiny["old_stories"]]
    sc = datagen.PRESETS["tiny"]
    assert max(new) <= NOW and min(new) >= NOW - timedelta(days=sc.new_days)
    assert max(old) <= NOW - timedelta(days=sc.new_days)
    assert min(old) >= NOW - timedelta(days=sc.new_days + sc.old_days)
    # OlderStories asks for each of the last 7 calendar days: every one has stories
    days = Counter(d.date() for d in new)
    for back in range(1, 8):
        assert days[(NOW - timedelta(days=back)).date()] > 0, back
    assert new == sorted(new)  # ids follow time


def test_titles_start_with_dictionary_words_for_the_searches(tiny):
    words = set(datagen.load_words())
    titles = [s[1] for s in tiny["stories"] + tiny["old_stories"]]
    assert all(t.split(" ")[0] in words or len(t) < 15 for t in titles)
    assert all(1 <= len(t) <= 100 for t in titles)
    assert len({t.split(" ")[0] for t in titles}) > 50  # many different first words


def test_presets_have_the_papers_sizes():
    paper = datagen.PRESETS["paper"]
    assert paper.users == 500_000 and paper.authors == 50
    assert paper.old_days == 730 and paper.new_days == 30
    with pytest.raises(ValueError, match="tiny, small, paper"):
        datagen.scale_named("huge")


def test_schema_files_split_into_tables_and_indexes():
    for dbms in ("postgresql", "mariadb"):
        tables, indexes = bulkload.schema_parts(datagen.HERE, dbms)
        created = [s for s in tables if s.upper().startswith("CREATE TABLE")]
        assert len(created) == 8
        assert any("Anonymous Coward" in s for s in tables)
        assert any("It''s funny.  Laugh." in s for s in tables)
        assert len(indexes) == 22
    _, maria = bulkload.schema_parts(datagen.HERE, "mariadb")
    assert sum("(10)" in s for s in maria) == 4  # the real prefix indexes
    _, pg = bulkload.schema_parts(datagen.HERE, "postgresql")
    assert sum("left(" in s for s in pg) == 4


def test_ids_are_laid_out_as_if_stories_had_moved_to_the_old_tables(tiny):
    """A story id names one story in either table (ViewStory looks in `stories`, then in
    `old_stories`): old stories take the low ids, new ones follow; the same for comments."""
    old = [int(s[0]) for s in tiny["old_stories"]]
    new = [int(s[0]) for s in tiny["stories"]]
    assert old == list(range(1, len(old) + 1))
    assert new == list(range(len(old) + 1, len(old) + len(new) + 1))
    old_c = [int(c[0]) for c in tiny["old_comments"]]
    new_c = [int(c[0]) for c in tiny["comments"]]
    assert old_c == list(range(1, len(old_c) + 1))
    assert new_c == list(range(len(old_c) + 1, len(old_c) + len(new_c) + 1))
    assert {int(m[2]) for m in tiny["moderator_log"]} <= set(new_c)
    # generating one table alone gives the same rows as generating all of them
    alone = [line.split("\t") for line in datagen.Generator(datagen.PRESETS["tiny"], seed=42, now=NOW).comments()]
    assert alone == tiny["comments"]
