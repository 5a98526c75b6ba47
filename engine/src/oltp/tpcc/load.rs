//! The nine TPC-C tables and their initial population (clause 4.3 as BenchBase implements it):
//! per warehouse 1 warehouse, 10 districts, 30,000 customers and history rows, 30,000 orders
//! (the last 900 of each district undelivered, in `new_order`), 5..15 lines per order, 100,000
//! stock rows; plus 100,000 items. Rows go in as multi-row INSERTs from `--threads` connections.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::random::*;
use crate::oltp::db::{Conn, Dbms};
use crate::oltp::error::OltpError;

pub const ITEMS: u64 = 100_000;
pub const DISTRICTS: u64 = 10;
pub const CUSTOMERS: u64 = 3000;
pub const ORDERS: u64 = 3000;
/// The first undelivered order of a district at load time.
pub const FIRST_NEW_ORDER: u64 = 2101;

/// The tables, in creation order.
pub const TABLES: [&str; 9] = ["warehouse", "district", "customer", "history", "orders", "new_order", "order_line", "item", "stock"];

fn ddl(dbms: Dbms) -> Vec<String> {
    let ts = if dbms == Dbms::Mysql { "DATETIME" } else { "TIMESTAMP" };
    let engine = if dbms == Dbms::Mysql { " ENGINE=InnoDB" } else { "" };
    let dist: Vec<String> = (1..=10).map(|i| format!("s_dist_{i:02} CHAR(24)")).collect();
    let t = [
        "warehouse (w_id INTEGER NOT NULL, w_name VARCHAR(10), w_street_1 VARCHAR(20), w_street_2 VARCHAR(20), w_city VARCHAR(20), w_state CHAR(2), w_zip CHAR(9), w_tax DOUBLE PRECISION, w_ytd DOUBLE PRECISION, PRIMARY KEY (w_id))".to_string(),
        "district (d_w_id INTEGER NOT NULL, d_id INTEGER NOT NULL, d_name VARCHAR(10), d_street_1 VARCHAR(20), d_street_2 VARCHAR(20), d_city VARCHAR(20), d_state CHAR(2), d_zip CHAR(9), d_tax DOUBLE PRECISION, d_ytd DOUBLE PRECISION, d_next_o_id INTEGER, PRIMARY KEY (d_w_id, d_id))".to_string(),
        format!("customer (c_w_id INTEGER NOT NULL, c_d_id INTEGER NOT NULL, c_id INTEGER NOT NULL, c_first VARCHAR(16), c_middle CHAR(2), c_last VARCHAR(16), c_street_1 VARCHAR(20), c_street_2 VARCHAR(20), c_city VARCHAR(20), c_state CHAR(2), c_zip CHAR(9), c_phone CHAR(16), c_since {ts}, c_credit CHAR(2), c_credit_lim DOUBLE PRECISION, c_discount DOUBLE PRECISION, c_balance DOUBLE PRECISION, c_ytd_payment DOUBLE PRECISION, c_payment_cnt INTEGER, c_delivery_cnt INTEGER, c_data VARCHAR(500), PRIMARY KEY (c_w_id, c_d_id, c_id))"),
        format!("history (h_c_id INTEGER, h_c_d_id INTEGER, h_c_w_id INTEGER, h_d_id INTEGER, h_w_id INTEGER, h_date {ts}, h_amount DOUBLE PRECISION, h_data VARCHAR(24))"),
        format!("orders (o_w_id INTEGER NOT NULL, o_d_id INTEGER NOT NULL, o_id INTEGER NOT NULL, o_c_id INTEGER, o_entry_d {ts}, o_carrier_id INTEGER, o_ol_cnt INTEGER, o_all_local INTEGER, PRIMARY KEY (o_w_id, o_d_id, o_id))"),
        "new_order (no_w_id INTEGER NOT NULL, no_d_id INTEGER NOT NULL, no_o_id INTEGER NOT NULL, PRIMARY KEY (no_w_id, no_d_id, no_o_id))".to_string(),
        format!("order_line (ol_w_id INTEGER NOT NULL, ol_d_id INTEGER NOT NULL, ol_o_id INTEGER NOT NULL, ol_number INTEGER NOT NULL, ol_i_id INTEGER, ol_supply_w_id INTEGER, ol_delivery_d {ts} NULL, ol_quantity INTEGER, ol_amount DOUBLE PRECISION, ol_dist_info CHAR(24), PRIMARY KEY (ol_w_id, ol_d_id, ol_o_id, ol_number))"),
        "item (i_id INTEGER NOT NULL, i_im_id INTEGER, i_name VARCHAR(24), i_price DOUBLE PRECISION, i_data VARCHAR(50), PRIMARY KEY (i_id))".to_string(),
        format!("stock (s_w_id INTEGER NOT NULL, s_i_id INTEGER NOT NULL, s_quantity INTEGER, {}, s_ytd INTEGER, s_order_cnt INTEGER, s_remote_cnt INTEGER, s_data VARCHAR(50), PRIMARY KEY (s_w_id, s_i_id))", dist.join(", ")),
    ];
    let mut out: Vec<String> = t.iter().map(|s| format!("CREATE TABLE {s}{engine}")).collect();
    out.push("CREATE INDEX customer_name ON customer (c_w_id, c_d_id, c_last, c_first)".into());
    out.push("CREATE INDEX orders_customer ON orders (o_w_id, o_d_id, o_c_id, o_id)".into());
    out
}

/// Rows of one table gathered into multi-row INSERTs of `batch` rows.
struct Inserter<'a> {
    conn: &'a mut Conn,
    head: String,
    sql: String,
    rows: usize,
    batch: usize,
    pub total: u64,
}

impl<'a> Inserter<'a> {
    fn new(conn: &'a mut Conn, table: &str, batch: usize) -> Inserter<'a> {
        let head = format!("INSERT INTO {table} VALUES ");
        Inserter { conn, sql: head.clone(), head, rows: 0, batch, total: 0 }
    }

    /// Add one row given as the SQL text of its values, comma-separated.
    fn row(&mut self, values: &str) -> Result<()> {
        if self.rows > 0 {
            self.sql.push(',');
        }
        self.sql.push('(');
        self.sql.push_str(values);
        self.sql.push(')');
        self.rows += 1;
        if self.rows >= self.batch {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.rows > 0 {
            self.conn.batch(&self.sql)?;
            self.total += self.rows as u64;
            self.rows = 0;
            self.sql.clear();
            self.sql.push_str(&self.head);
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
enum Job {
    Items,
    Warehouse(u64),
    Stock(u64),
    Customers(u64, u64),
    Orders(u64, u64),
}

/// Drop and create the tables, then load `warehouses` warehouses; returns rows per table.
pub fn load(dsn: &str, warehouses: u64, threads: usize, batch: usize, seed: u64, max_seconds: f64) -> Result<Vec<(String, u64)>> {
    let mut conn = Conn::connect(dsn)?;
    let dbms = conn.dbms();
    for t in TABLES.iter().rev() {
        conn.batch(&format!("DROP TABLE IF EXISTS {t}"))?;
    }
    for stmt in ddl(dbms) {
        conn.batch(&stmt)?;
    }
    drop(conn);
    let mut jobs = vec![Job::Items];
    for w in 1..=warehouses {
        jobs.push(Job::Stock(w));
        jobs.push(Job::Warehouse(w));
        for d in 1..=DISTRICTS {
            jobs.push(Job::Orders(w, d));
            jobs.push(Job::Customers(w, d));
        }
    }
    jobs.reverse(); // pop() takes the items first
    let jobs = Arc::new(Mutex::new(jobs));
    let counts = Arc::new(Mutex::new(vec![0u64; TABLES.len()]));
    let deadline = Instant::now() + Duration::from_secs_f64(max_seconds);
    let mut handles = Vec::new();
    for t in 0..threads.max(1) {
        let (jobs, counts, dsn) = (jobs.clone(), counts.clone(), dsn.to_string());
        handles.push(std::thread::spawn(move || -> Result<()> {
            let mut conn = Conn::connect(&dsn)?;
            let mut rng = SmallRng::seed_from_u64(seed.wrapping_mul(31).wrapping_add(t as u64));
            loop {
                if Instant::now() > deadline {
                    return Err(OltpError::LoadTimeout { seconds: max_seconds }.into());
                }
                let job = jobs.lock().expect("jobs lock").pop();
                let Some(job) = job else { return Ok(()) };
                let done = run_job(&mut conn, &mut rng, job, batch)?;
                let mut c = counts.lock().expect("counts lock");
                for (i, n) in done {
                    c[i] += n;
                }
            }
        }));
    }
    for h in handles {
        h.join().map_err(|_| anyhow!("a load thread panicked"))??;
    }
    let mut conn = Conn::connect(dsn)?;
    let analyze = if dbms == Dbms::Mysql { "ANALYZE TABLE " } else { "ANALYZE " };
    for t in TABLES {
        conn.batch(&format!("{analyze}{t}"))?;
    }
    let c = counts.lock().expect("counts lock");
    Ok(TABLES.iter().zip(c.iter()).map(|(t, n)| (t.to_string(), *n)).collect())
}

fn idx(table: &str) -> usize {
    TABLES.iter().position(|t| *t == table).expect("known table")
}

fn run_job(conn: &mut Conn, rng: &mut SmallRng, job: Job, batch: usize) -> Result<Vec<(usize, u64)>> {
    match job {
        Job::Items => {
            let mut ins = Inserter::new(conn, "item", batch);
            for i in 1..=ITEMS {
                let v = format!(
                    "{i},{},'{}',{:.2},'{}'",
                    rng.gen_range(1..=10_000),
                    astring(rng, 14, 24),
                    fixed(rng, 1.0, 100.0, 2),
                    data_with_original(rng)
                );
                ins.row(&v)?;
            }
            ins.flush()?;
            Ok(vec![(idx("item"), ins.total)])
        }
        Job::Warehouse(w) => {
            let v = format!(
                "{w},'{}','{}','{}','{}','{}','{}',{:.4},300000.00",
                astring(rng, 6, 10),
                astring(rng, 10, 20),
                astring(rng, 10, 20),
                astring(rng, 10, 20),
                astring(rng, 2, 2),
                zip(rng),
                fixed(rng, 0.0, 0.2, 4)
            );
            let mut ins = Inserter::new(conn, "warehouse", batch);
            ins.row(&v)?;
            ins.flush()?;
            let mut dis = Inserter::new(conn, "district", batch);
            for d in 1..=DISTRICTS {
                let v = format!(
                    "{w},{d},'{}','{}','{}','{}','{}','{}',{:.4},30000.00,{}",
                    astring(rng, 6, 10),
                    astring(rng, 10, 20),
                    astring(rng, 10, 20),
                    astring(rng, 10, 20),
                    astring(rng, 2, 2),
                    zip(rng),
                    fixed(rng, 0.0, 0.2, 4),
                    ORDERS + 1
                );
                dis.row(&v)?;
            }
            dis.flush()?;
            Ok(vec![(idx("warehouse"), 1), (idx("district"), dis.total)])
        }
        Job::Stock(w) => {
            let mut ins = Inserter::new(conn, "stock", batch);
            for i in 1..=ITEMS {
                let mut v = format!("{w},{i},{}", rng.gen_range(10..=100));
                for _ in 0..10 {
                    v.push_str(",'");
                    v.push_str(&astring(rng, 24, 24));
                    v.push('\'');
                }
                v.push_str(&format!(",0,0,0,'{}'", data_with_original(rng)));
                ins.row(&v)?;
            }
            ins.flush()?;
            Ok(vec![(idx("stock"), ins.total)])
        }
        Job::Customers(w, d) => {
            let mut cus = Inserter::new(conn, "customer", batch);
            for c in 1..=CUSTOMERS {
                let last = if c <= 1000 { c - 1 } else { nurand(rng, A_C_LAST, 0, 999, C_LOAD.c_last) };
                let credit = if rng.gen_range(0..10) == 0 { "BC" } else { "GC" };
                let v = format!(
                    "{w},{d},{c},'{}','OE','{}','{}','{}','{}','{}','{}','{}',CURRENT_TIMESTAMP,'{credit}',50000.00,{:.4},-10.00,10.00,1,0,'{}'",
                    astring(rng, 8, 16),
                    last_name(last),
                    astring(rng, 10, 20),
                    astring(rng, 10, 20),
                    astring(rng, 10, 20),
                    astring(rng, 2, 2),
                    zip(rng),
                    nstring(rng, 16, 16),
                    fixed(rng, 0.0, 0.5, 4),
                    astring(rng, 300, 500)
                );
                cus.row(&v)?;
            }
            cus.flush()?;
            let n_cus = cus.total;
            let mut his = Inserter::new(conn, "history", batch);
            for c in 1..=CUSTOMERS {
                his.row(&format!("{c},{d},{w},{d},{w},CURRENT_TIMESTAMP,10.00,'{}'", astring(rng, 12, 24)))?;
            }
            his.flush()?;
            Ok(vec![(idx("customer"), n_cus), (idx("history"), his.total)])
        }
        Job::Orders(w, d) => {
            let mut perm: Vec<u64> = (1..=CUSTOMERS).collect();
            perm.shuffle(rng);
            let mut lines_sql: Vec<String> = Vec::new();
            let mut ord = Inserter::new(conn, "orders", batch);
            for o in 1..=ORDERS {
                let cnt = rng.gen_range(5..=15u64);
                let carrier = if o < FIRST_NEW_ORDER { rng.gen_range(1..=10).to_string() } else { "NULL".to_string() };
                ord.row(&format!("{w},{d},{o},{},CURRENT_TIMESTAMP,{carrier},{cnt},1", perm[(o - 1) as usize]))?;
                for n in 1..=cnt {
                    let (delivery, amount) = if o < FIRST_NEW_ORDER { ("CURRENT_TIMESTAMP", 0.0) } else { ("NULL", fixed(rng, 0.01, 9999.99, 2)) };
                    lines_sql.push(format!("{w},{d},{o},{n},{},{w},{delivery},5,{amount:.2},'{}'", rng.gen_range(1..=ITEMS), astring(rng, 24, 24)));
                }
            }
            ord.flush()?;
            let n_ord = ord.total;
            let mut nos = Inserter::new(conn, "new_order", batch);
            for o in FIRST_NEW_ORDER..=ORDERS {
                nos.row(&format!("{w},{d},{o}"))?;
            }
            nos.flush()?;
            let n_no = nos.total;
            let mut ol = Inserter::new(conn, "order_line", batch);
            for l in &lines_sql {
                ol.row(l)?;
            }
            ol.flush()?;
            Ok(vec![(idx("orders"), n_ord), (idx("new_order"), n_no), (idx("order_line"), ol.total)])
        }
    }
}
