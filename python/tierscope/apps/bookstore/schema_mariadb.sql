-- TPC-W bookstore schema for MariaDB (tierscope). The 10 tables of the TPC-W population
-- (research note phase2-workloads §1.1) with the Wisconsin implementation's columns. Engine InnoDB.
-- Ids that the application mints at run time (customer, address, orders, shopping_cart) and the
-- loaded ones (author, item) are AUTO_INCREMENT; InnoDB moves the counter past explicitly loaded
-- ids by itself. Nothing takes max(id)+1 or count(*)+1.
-- The part before the "@indexes" marker line creates the tables; the part after it the secondary
-- indexes, one ALTER TABLE per table (the data generator runs them after the bulk load).

DROP TABLE IF EXISTS country, author, item, customer, address, orders, order_line, cc_xacts,
    shopping_cart, shopping_cart_line;

CREATE TABLE country (
    co_id INT NOT NULL,
    co_name VARCHAR(50),
    co_exchange DOUBLE,
    co_currency VARCHAR(18),
    PRIMARY KEY (co_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE author (
    a_id INT NOT NULL AUTO_INCREMENT,
    a_fname VARCHAR(20),
    a_lname VARCHAR(20),
    a_mname VARCHAR(20),
    a_dob DATE,
    a_bio VARCHAR(500),
    PRIMARY KEY (a_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE item (
    i_id INT NOT NULL AUTO_INCREMENT,
    i_title VARCHAR(60),
    i_a_id INT,
    i_pub_date DATE,
    i_publisher VARCHAR(60),
    i_subject VARCHAR(60),
    i_desc VARCHAR(500),
    i_related1 INT,
    i_related2 INT,
    i_related3 INT,
    i_related4 INT,
    i_related5 INT,
    i_thumbnail VARCHAR(40),
    i_image VARCHAR(40),
    i_srp DOUBLE,
    i_cost DOUBLE,
    i_avail DATE,
    i_stock INT,
    i_isbn CHAR(13),
    i_page INT,
    i_backing VARCHAR(15),
    i_dimensions VARCHAR(25),
    PRIMARY KEY (i_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE customer (
    c_id INT NOT NULL AUTO_INCREMENT,
    c_uname VARCHAR(20),
    c_passwd VARCHAR(20),
    c_fname VARCHAR(17),
    c_lname VARCHAR(17),
    c_addr_id INT,
    c_phone VARCHAR(18),
    c_email VARCHAR(50),
    c_since DATE,
    c_last_login DATE,
    c_login DATETIME,
    c_expiration DATETIME,
    c_discount FLOAT,
    c_balance DOUBLE,
    c_ytd_pmt DOUBLE,
    c_birthdate DATE,
    c_data VARCHAR(500),
    PRIMARY KEY (c_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE address (
    addr_id INT NOT NULL AUTO_INCREMENT,
    addr_street1 VARCHAR(40),
    addr_street2 VARCHAR(40),
    addr_city VARCHAR(30),
    addr_state VARCHAR(20),
    addr_zip VARCHAR(10),
    addr_co_id INT,
    PRIMARY KEY (addr_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE orders (
    o_id INT NOT NULL AUTO_INCREMENT,
    o_c_id INT,
    o_date DATETIME,
    o_sub_total DOUBLE,
    o_tax DOUBLE,
    o_total DOUBLE,
    o_ship_type VARCHAR(10),
    o_ship_date DATETIME,
    o_bill_addr_id INT,
    o_ship_addr_id INT,
    o_status VARCHAR(15),
    PRIMARY KEY (o_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE order_line (
    ol_id INT NOT NULL,
    ol_o_id INT NOT NULL,
    ol_i_id INT,
    ol_qty INT,
    ol_discount DOUBLE,
    ol_comments VARCHAR(110),
    PRIMARY KEY (ol_id, ol_o_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE cc_xacts (
    cx_o_id INT NOT NULL,
    cx_type VARCHAR(10),
    cx_num VARCHAR(20),
    cx_name VARCHAR(30),
    cx_expire DATE,
    cx_auth_id CHAR(15),
    cx_xact_amt DOUBLE,
    cx_xact_date DATETIME,
    cx_co_id INT,
    PRIMARY KEY (cx_o_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE shopping_cart (
    sc_id INT NOT NULL AUTO_INCREMENT,
    sc_time DATETIME,
    PRIMARY KEY (sc_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE TABLE shopping_cart_line (
    scl_sc_id INT NOT NULL,
    scl_qty INT,
    scl_i_id INT NOT NULL,
    PRIMARY KEY (scl_sc_id, scl_i_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- @indexes
ALTER TABLE author ADD INDEX author_a_lname (a_lname);
ALTER TABLE address ADD INDEX address_addr_co_id (addr_co_id), ADD INDEX addr_zip (addr_zip);
ALTER TABLE customer ADD INDEX customer_c_addr_id (c_addr_id), ADD INDEX customer_c_uname (c_uname);
ALTER TABLE item ADD INDEX item_i_title (i_title), ADD INDEX item_i_subject (i_subject), ADD INDEX item_i_a_id (i_a_id);
ALTER TABLE order_line ADD INDEX order_line_ol_i_id (ol_i_id), ADD INDEX order_line_ol_o_id (ol_o_id);
ALTER TABLE country ADD INDEX country_co_name (co_name);
ALTER TABLE orders ADD INDEX orders_o_c_id (o_c_id);
ALTER TABLE shopping_cart_line ADD INDEX scl_i_id (scl_i_id);
