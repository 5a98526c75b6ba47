-- RUBBoS schema for MariaDB (tierscope). The 8 tables of the original (digest §3.1) with the
-- same columns and indexes, including the 10-character prefix indexes on stories.title and
-- comments.subject. Engine: InnoDB (the original's MySQL defaulted to MyISAM; InnoDB is what a
-- MariaDB of today runs, with row locks instead of table locks).
-- The part before the "@indexes" marker line creates the tables; the part after it the secondary
-- indexes (the data generator creates them after the bulk load, which is faster).
-- NO_AUTO_VALUE_ON_ZERO lets the anonymous user keep id 0.

SET SESSION sql_mode = CONCAT(@@sql_mode, ',NO_AUTO_VALUE_ON_ZERO');

DROP TABLE IF EXISTS categories, users, stories, old_stories, submissions, comments,
    old_comments, moderator_log;

CREATE TABLE categories (
    id INT UNSIGNED NOT NULL,
    name VARCHAR(50),
    PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE users (
    id INT UNSIGNED NOT NULL AUTO_INCREMENT,
    firstname VARCHAR(20),
    lastname VARCHAR(20),
    nickname VARCHAR(20) NOT NULL,
    password VARCHAR(20) NOT NULL,
    email VARCHAR(50) NOT NULL,
    rating INT,
    access INT,
    creation_date DATETIME,
    PRIMARY KEY (id),
    UNIQUE KEY nickname (nickname)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE stories (
    id INT UNSIGNED NOT NULL AUTO_INCREMENT,
    title VARCHAR(100),
    body TEXT,
    date DATETIME,
    writer INT UNSIGNED NOT NULL,
    category INT UNSIGNED NOT NULL,
    PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE old_stories (
    id INT UNSIGNED NOT NULL AUTO_INCREMENT,
    title VARCHAR(100),
    body TEXT,
    date DATETIME,
    writer INT UNSIGNED NOT NULL,
    category INT UNSIGNED NOT NULL,
    PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE submissions (
    id INT UNSIGNED NOT NULL AUTO_INCREMENT,
    title VARCHAR(100),
    body TEXT,
    date DATETIME,
    writer INT UNSIGNED,
    category INT UNSIGNED NOT NULL,
    PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE comments (
    id INT UNSIGNED NOT NULL AUTO_INCREMENT,
    writer INT UNSIGNED,
    story_id INT UNSIGNED NOT NULL,
    parent INT UNSIGNED,
    childs INT UNSIGNED,
    rating INT,
    date DATETIME,
    subject VARCHAR(100),
    comment TEXT,
    PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE old_comments (
    id INT UNSIGNED NOT NULL AUTO_INCREMENT,
    writer INT UNSIGNED,
    story_id INT UNSIGNED NOT NULL,
    parent INT UNSIGNED,
    childs INT UNSIGNED,
    rating INT,
    date DATETIME,
    subject VARCHAR(100),
    comment TEXT,
    PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE moderator_log (
    id INT UNSIGNED NOT NULL AUTO_INCREMENT,
    moderator_id INT UNSIGNED NOT NULL,
    comment_id INT UNSIGNED NOT NULL,
    rating INT,
    date DATETIME,
    PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

INSERT INTO users (id, firstname, lastname, nickname, password, email, rating, access, creation_date)
VALUES (0, 'Anonymous', 'Coward', 'Anonymous Coward', '', 'anonymous@rubbos.com', 0, 0, NOW());

-- The 85 categories of the original (Slashdot's topics of 2000), ids 0..84.
INSERT INTO categories (id, name) VALUES
    (0, 'AMD'),
    (1, 'America Online'),
    (2, 'Amiga'),
    (3, 'Anime'),
    (4, 'Announcements'),
    (5, 'Apache'),
    (6, 'Apple'),
    (7, 'Be'),
    (8, 'Beanies'),
    (9, 'BSD'),
    (10, 'Bug'),
    (11, 'Caldera'),
    (12, 'CDA'),
    (13, 'Censorship'),
    (14, 'Christmas Cheer'),
    (15, 'Comdex'),
    (16, 'Compaq'),
    (17, 'Corel'),
    (18, 'Debian'),
    (19, 'Digital'),
    (20, 'Editorial'),
    (21, 'Education'),
    (22, 'Encryption'),
    (23, 'Enlightenment'),
    (24, 'ePlus'),
    (25, 'Games'),
    (26, 'GNOME'),
    (27, 'GNU is Not Unix'),
    (28, 'GNUStep'),
    (29, 'Graphics'),
    (30, 'Handhelds'),
    (31, 'Hardware'),
    (32, 'IBM'),
    (33, 'Intel'),
    (34, 'Internet Explorer'),
    (35, 'It''s funny.  Laugh.'),
    (36, 'Java'),
    (37, 'KDE'),
    (38, 'Links'),
    (39, 'Linux'),
    (40, 'Linux Business'),
    (41, 'Linux Mandrake'),
    (42, 'Linuxcare'),
    (43, 'Microsoft'),
    (44, 'Movies'),
    (45, 'Mozilla'),
    (46, 'Music'),
    (47, 'Netscape'),
    (48, 'News'),
    (49, 'Patents'),
    (50, 'Perl'),
    (51, 'PHP'),
    (52, 'Privacy'),
    (53, 'Programming'),
    (54, 'Quake'),
    (55, 'Quickies'),
    (56, 'Red Hat Software'),
    (57, 'Science'),
    (58, 'Security'),
    (59, 'Silicon Graphics'),
    (60, 'Slashback'),
    (61, 'Slashdot.org'),
    (62, 'Space'),
    (63, 'Spam'),
    (64, 'Star Wars Prequels'),
    (65, 'Sun Microsystems'),
    (66, 'SuSE'),
    (67, 'Technology'),
    (68, 'Television'),
    (69, 'The Almighty Buck'),
    (70, 'The Courts'),
    (71, 'The Gimp'),
    (72, 'The Internet'),
    (73, 'The Media'),
    (74, 'Toys'),
    (75, 'Transmeta'),
    (76, 'TurboLinux'),
    (77, 'United States'),
    (78, 'Unix'),
    (79, 'Upgrades'),
    (80, 'User Journal'),
    (81, 'VA'),
    (82, 'Wine'),
    (83, 'X'),
    (84, 'Ximian');

-- @indexes
CREATE INDEX auth ON users (nickname, password);
CREATE INDEX search ON users (nickname);
CREATE INDEX writer_id ON stories (writer);
CREATE INDEX category_id ON stories (category);
CREATE INDEX search ON stories (title(10));
CREATE INDEX day ON stories (date);
CREATE INDEX writer_id ON old_stories (writer);
CREATE INDEX category_id ON old_stories (category);
CREATE INDEX search ON old_stories (title(10));
CREATE INDEX day ON old_stories (date);
CREATE INDEX writer_id ON submissions (writer);
CREATE INDEX category_id ON submissions (category);
CREATE INDEX day ON submissions (date);
CREATE INDEX story ON comments (story_id);
CREATE INDEX search ON comments (subject(10));
CREATE INDEX parent_id ON comments (parent);
CREATE INDEX rating_num ON comments (rating);
CREATE INDEX story ON old_comments (story_id);
CREATE INDEX search ON old_comments (subject(10));
CREATE INDEX parent_id ON old_comments (parent);
CREATE INDEX rating_num ON old_comments (rating);
CREATE INDEX comment ON moderator_log (comment_id);
