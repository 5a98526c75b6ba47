//! The five TPC-C transactions (clause 2), one database transaction each, on prepared
//! statements. Rows that a transaction later updates are read `FOR UPDATE`, and New-Order locks
//! its stock rows in item order, so the server's default isolation (PostgreSQL READ COMMITTED,
//! InnoDB REPEATABLE READ) loses no update and deadlocks stay rare.
//!
//! Delivery is run **directly**: the terminal executes all ten districts in one transaction and
//! waits for it (as BenchBase does), not queued to a deferred executor as the spec allows.

use anyhow::{anyhow, Result};
use rand::rngs::SmallRng;
use rand::Rng;

use super::load::{CUSTOMERS, DISTRICTS, ITEMS};
use super::random::*;
use crate::oltp::db::{Conn, Stmt, Val};

pub struct Statements {
    no_warehouse: Stmt,
    no_district: Stmt,
    no_district_bump: Stmt,
    no_customer: Stmt,
    no_order: Stmt,
    no_new_order: Stmt,
    no_item: Stmt,
    no_stock: Vec<Stmt>,
    no_stock_update: Stmt,
    no_line: Stmt,
    pay_wh_update: Stmt,
    pay_wh: Stmt,
    pay_d_update: Stmt,
    pay_d: Stmt,
    cust_by_name: Stmt,
    pay_customer: Stmt,
    pay_c_data: Stmt,
    pay_cust_update_bc: Stmt,
    pay_cust_update: Stmt,
    pay_history: Stmt,
    os_customer: Stmt,
    os_order: Stmt,
    os_lines: Stmt,
    dl_oldest: Stmt,
    dl_delete: Stmt,
    dl_order: Stmt,
    dl_carrier: Stmt,
    dl_lines: Stmt,
    dl_sum: Stmt,
    dl_customer: Stmt,
    sl_next: Stmt,
    sl_count: Stmt,
}

pub fn prepare(c: &mut Conn) -> Result<Statements> {
    Ok(Statements {
        no_warehouse: c.prepare("SELECT w_tax FROM warehouse WHERE w_id = ?")?,
        no_district: c.prepare("SELECT d_tax, d_next_o_id FROM district WHERE d_w_id = ? AND d_id = ? FOR UPDATE")?,
        no_district_bump: c.prepare("UPDATE district SET d_next_o_id = d_next_o_id + 1 WHERE d_w_id = ? AND d_id = ?")?,
        no_customer: c.prepare("SELECT c_discount, c_last, c_credit FROM customer WHERE c_w_id = ? AND c_d_id = ? AND c_id = ?")?,
        no_order: c.prepare("INSERT INTO orders (o_w_id, o_d_id, o_id, o_c_id, o_entry_d, o_carrier_id, o_ol_cnt, o_all_local) VALUES (?, ?, ?, ?, CURRENT_TIMESTAMP, NULL, ?, ?)")?,
        no_new_order: c.prepare("INSERT INTO new_order (no_w_id, no_d_id, no_o_id) VALUES (?, ?, ?)")?,
        no_item: c.prepare("SELECT i_price, i_name, i_data FROM item WHERE i_id = ?")?,
        no_stock: (1..=10)
            .map(|d| c.prepare(&format!("SELECT s_quantity, s_data, s_dist_{d:02} FROM stock WHERE s_w_id = ? AND s_i_id = ? FOR UPDATE")))
            .collect::<Result<Vec<_>>>()?,
        no_stock_update: c.prepare("UPDATE stock SET s_quantity = ?, s_ytd = s_ytd + ?, s_order_cnt = s_order_cnt + 1, s_remote_cnt = s_remote_cnt + ? WHERE s_w_id = ? AND s_i_id = ?")?,
        no_line: c.prepare("INSERT INTO order_line (ol_w_id, ol_d_id, ol_o_id, ol_number, ol_i_id, ol_supply_w_id, ol_delivery_d, ol_quantity, ol_amount, ol_dist_info) VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, ?)")?,
        pay_wh_update: c.prepare("UPDATE warehouse SET w_ytd = w_ytd + ? WHERE w_id = ?")?,
        pay_wh: c.prepare("SELECT w_name, w_street_1, w_street_2, w_city, w_state, w_zip FROM warehouse WHERE w_id = ?")?,
        pay_d_update: c.prepare("UPDATE district SET d_ytd = d_ytd + ? WHERE d_w_id = ? AND d_id = ?")?,
        pay_d: c.prepare("SELECT d_name, d_street_1, d_street_2, d_city, d_state, d_zip FROM district WHERE d_w_id = ? AND d_id = ?")?,
        cust_by_name: c.prepare("SELECT c_id FROM customer WHERE c_w_id = ? AND c_d_id = ? AND c_last = ? ORDER BY c_first")?,
        pay_customer: c.prepare("SELECT c_first, c_middle, c_last, c_street_1, c_city, c_state, c_zip, c_phone, c_credit, c_credit_lim, c_discount, c_balance FROM customer WHERE c_w_id = ? AND c_d_id = ? AND c_id = ? FOR UPDATE")?,
        pay_c_data: c.prepare("SELECT c_data FROM customer WHERE c_w_id = ? AND c_d_id = ? AND c_id = ?")?,
        pay_cust_update_bc: c.prepare("UPDATE customer SET c_balance = c_balance - ?, c_ytd_payment = c_ytd_payment + ?, c_payment_cnt = c_payment_cnt + 1, c_data = ? WHERE c_w_id = ? AND c_d_id = ? AND c_id = ?")?,
        pay_cust_update: c.prepare("UPDATE customer SET c_balance = c_balance - ?, c_ytd_payment = c_ytd_payment + ?, c_payment_cnt = c_payment_cnt + 1 WHERE c_w_id = ? AND c_d_id = ? AND c_id = ?")?,
        pay_history: c.prepare("INSERT INTO history (h_c_id, h_c_d_id, h_c_w_id, h_d_id, h_w_id, h_date, h_amount, h_data) VALUES (?, ?, ?, ?, ?, CURRENT_TIMESTAMP, ?, ?)")?,
        os_customer: c.prepare("SELECT c_balance, c_first, c_middle, c_last FROM customer WHERE c_w_id = ? AND c_d_id = ? AND c_id = ?")?,
        os_order: c.prepare("SELECT o_id, o_carrier_id, o_entry_d FROM orders WHERE o_w_id = ? AND o_d_id = ? AND o_c_id = ? ORDER BY o_id DESC LIMIT 1")?,
        os_lines: c.prepare("SELECT ol_i_id, ol_supply_w_id, ol_quantity, ol_amount, ol_delivery_d FROM order_line WHERE ol_w_id = ? AND ol_d_id = ? AND ol_o_id = ?")?,
        dl_oldest: c.prepare("SELECT no_o_id FROM new_order WHERE no_w_id = ? AND no_d_id = ? ORDER BY no_o_id LIMIT 1 FOR UPDATE")?,
        dl_delete: c.prepare("DELETE FROM new_order WHERE no_w_id = ? AND no_d_id = ? AND no_o_id = ?")?,
        dl_order: c.prepare("SELECT o_c_id FROM orders WHERE o_w_id = ? AND o_d_id = ? AND o_id = ?")?,
        dl_carrier: c.prepare("UPDATE orders SET o_carrier_id = ? WHERE o_w_id = ? AND o_d_id = ? AND o_id = ?")?,
        dl_lines: c.prepare("UPDATE order_line SET ol_delivery_d = CURRENT_TIMESTAMP WHERE ol_w_id = ? AND ol_d_id = ? AND ol_o_id = ?")?,
        dl_sum: c.prepare("SELECT SUM(ol_amount) FROM order_line WHERE ol_w_id = ? AND ol_d_id = ? AND ol_o_id = ?")?,
        dl_customer: c.prepare("UPDATE customer SET c_balance = c_balance + ?, c_delivery_cnt = c_delivery_cnt + 1 WHERE c_w_id = ? AND c_d_id = ? AND c_id = ?")?,
        sl_next: c.prepare("SELECT d_next_o_id FROM district WHERE d_w_id = ? AND d_id = ?")?,
        sl_count: c.prepare(
            "SELECT COUNT(DISTINCT s.s_i_id) FROM order_line ol JOIN stock s ON s.s_i_id = ol.ol_i_id AND s.s_w_id = ol.ol_w_id \
             WHERE ol.ol_w_id = ? AND ol.ol_d_id = ? AND ol.ol_o_id < ? AND ol.ol_o_id >= ? AND s.s_quantity < ?",
        )?,
    })
}

/// Where a terminal sits, and the run's size.
#[derive(Clone, Copy, Debug)]
pub struct Terminal {
    pub w: u64,
    pub d: u64,
    pub warehouses: u64,
}

/// What a transaction did, beyond its outcome (for the summary's cross-checks).
#[derive(Clone, Copy, Debug, Default)]
pub struct Effects {
    pub rolled_back: bool,
    pub remote_lines: u64,
    pub lines: u64,
    pub remote_payment: bool,
    pub by_name: bool,
    pub delivered: u64,
    pub skipped_districts: u64,
}

fn one(rows: Vec<Vec<Val>>, what: &str) -> Result<Vec<Val>> {
    rows.into_iter().next().ok_or_else(|| anyhow!("{what}: no row"))
}

fn other_warehouse(rng: &mut SmallRng, t: &Terminal) -> u64 {
    if t.warehouses <= 1 {
        return t.w;
    }
    let mut o = rng.gen_range(1..t.warehouses);
    if o >= t.w {
        o += 1;
    }
    o
}

/// The customer id by last name: the one at position ⌈n/2⌉ of the matches ordered by c_first.
fn customer_by_name(c: &mut Conn, s: &Statements, w: u64, d: u64, last: &str) -> Result<i64> {
    let rows = c.query(s.cust_by_name, &[w.into(), d.into(), last.into()])?;
    if rows.is_empty() {
        return Err(anyhow!("no customer named {last} in ({w}, {d})"));
    }
    rows[(rows.len() - 1) / 2][0].i64()
}

pub fn new_order(c: &mut Conn, s: &Statements, rng: &mut SmallRng, t: &Terminal) -> Result<Effects> {
    let w = t.w;
    let d = rng.gen_range(1..=DISTRICTS);
    let cid = nurand(rng, A_C_ID, 1, CUSTOMERS, C_RUN.c_id);
    let n = rng.gen_range(5..=15u64);
    let rollback = rng.gen_range(1..=100) == 1;
    let mut lines: Vec<(u64, u64, i64)> = (0..n)
        .map(|i| {
            let item = if rollback && i == n - 1 { ITEMS + 1 } else { nurand(rng, A_OL_I_ID, 1, ITEMS, C_RUN.ol_i_id) };
            let supply = if t.warehouses > 1 && rng.gen_range(1..=100) == 1 { other_warehouse(rng, t) } else { w };
            (item, supply, rng.gen_range(1..=10i64))
        })
        .collect();
    // lock stock rows in one global order (the unused item id sorts last)
    lines.sort_by_key(|l| (l.0, l.1));
    let all_local = lines.iter().all(|l| l.1 == w) as i64;
    let mut fx = Effects { lines: n, remote_lines: lines.iter().filter(|l| l.1 != w).count() as u64, ..Default::default() };
    c.begin()?;
    let _w_tax = one(c.query(s.no_warehouse, &[w.into()])?, "warehouse")?[0].f64()?;
    let drow = one(c.query(s.no_district, &[w.into(), d.into()])?, "district")?;
    let o_id = drow[1].i64()?;
    c.execute(s.no_district_bump, &[w.into(), d.into()])?;
    let _cust = one(c.query(s.no_customer, &[w.into(), d.into(), cid.into()])?, "customer")?;
    c.execute(s.no_order, &[w.into(), d.into(), o_id.into(), cid.into(), (n as i64).into(), all_local.into()])?;
    c.execute(s.no_new_order, &[w.into(), d.into(), o_id.into()])?;
    for (num, (item, supply, qty)) in lines.iter().enumerate() {
        let irow = c.query(s.no_item, &[(*item).into()])?;
        let Some(irow) = irow.into_iter().next() else {
            // the 1 % of New-Orders with an unused item: the spec's deliberate rollback
            c.rollback()?;
            fx.rolled_back = true;
            return Ok(fx);
        };
        let price = irow[0].f64()?;
        let srow = one(c.query(s.no_stock[(d - 1) as usize], &[(*supply).into(), (*item).into()])?, "stock")?;
        let sq = srow[0].i64()?;
        let new_q = if sq - qty >= 10 { sq - qty } else { sq - qty + 91 };
        let remote = (*supply != w) as i64;
        c.execute(s.no_stock_update, &[new_q.into(), (*qty).into(), remote.into(), (*supply).into(), (*item).into()])?;
        let dist_info = match &srow[2] {
            Val::S(x) => x.clone(),
            _ => String::new(),
        };
        let amount = (*qty as f64) * price;
        c.execute(
            s.no_line,
            &[
                w.into(),
                d.into(),
                o_id.into(),
                ((num + 1) as i64).into(),
                (*item).into(),
                (*supply).into(),
                (*qty).into(),
                amount.into(),
                dist_info.into(),
            ],
        )?;
    }
    c.commit()?;
    Ok(fx)
}

pub fn payment(c: &mut Conn, s: &Statements, rng: &mut SmallRng, t: &Terminal) -> Result<Effects> {
    let w = t.w;
    let d = rng.gen_range(1..=DISTRICTS);
    let remote = t.warehouses > 1 && rng.gen_range(1..=100) <= 15;
    let (cw, cd) = if remote { (other_warehouse(rng, t), rng.gen_range(1..=DISTRICTS)) } else { (w, d) };
    let by_name = rng.gen_range(1..=100) <= 60;
    let amount = fixed(rng, 1.0, 5000.0, 2);
    let last = last_name(nurand(rng, A_C_LAST, 0, 999, C_RUN.c_last));
    let cid_draw = nurand(rng, A_C_ID, 1, CUSTOMERS, C_RUN.c_id) as i64;
    c.begin()?;
    c.execute(s.pay_wh_update, &[amount.into(), w.into()])?;
    let wrow = one(c.query(s.pay_wh, &[w.into()])?, "warehouse")?;
    c.execute(s.pay_d_update, &[amount.into(), w.into(), d.into()])?;
    let drow = one(c.query(s.pay_d, &[w.into(), d.into()])?, "district")?;
    let cid = if by_name { customer_by_name(c, s, cw, cd, &last)? } else { cid_draw };
    let crow = one(c.query(s.pay_customer, &[cw.into(), cd.into(), cid.into()])?, "customer")?;
    let bad_credit = matches!(&crow[8], Val::S(x) if x.starts_with("BC"));
    if bad_credit {
        let old = match one(c.query(s.pay_c_data, &[cw.into(), cd.into(), cid.into()])?, "c_data")?.remove(0) {
            Val::S(x) => x,
            _ => String::new(),
        };
        let mut data = format!("{cid} {cd} {cw} {d} {w} {amount:.2} | {old}");
        data.truncate(500);
        c.execute(s.pay_cust_update_bc, &[amount.into(), amount.into(), data.into(), cw.into(), cd.into(), cid.into()])?;
    } else {
        c.execute(s.pay_cust_update, &[amount.into(), amount.into(), cw.into(), cd.into(), cid.into()])?;
    }
    let name = |v: &Val| match v {
        Val::S(x) => x.clone(),
        _ => String::new(),
    };
    let mut h_data = format!("{}    {}", name(&wrow[0]), name(&drow[0]));
    h_data.truncate(24);
    c.execute(s.pay_history, &[cid.into(), cd.into(), cw.into(), d.into(), w.into(), amount.into(), h_data.into()])?;
    c.commit()?;
    Ok(Effects { remote_payment: remote, by_name, ..Default::default() })
}

pub fn order_status(c: &mut Conn, s: &Statements, rng: &mut SmallRng, t: &Terminal) -> Result<Effects> {
    let w = t.w;
    let d = rng.gen_range(1..=DISTRICTS);
    let by_name = rng.gen_range(1..=100) <= 60;
    let last = last_name(nurand(rng, A_C_LAST, 0, 999, C_RUN.c_last));
    let cid_draw = nurand(rng, A_C_ID, 1, CUSTOMERS, C_RUN.c_id) as i64;
    c.begin()?;
    let cid = if by_name { customer_by_name(c, s, w, d, &last)? } else { cid_draw };
    one(c.query(s.os_customer, &[w.into(), d.into(), cid.into()])?, "customer")?;
    if let Some(order) = c.query(s.os_order, &[w.into(), d.into(), cid.into()])?.into_iter().next() {
        let o_id = order[0].i64()?;
        c.query(s.os_lines, &[w.into(), d.into(), o_id.into()])?;
    }
    c.commit()?;
    Ok(Effects { by_name, ..Default::default() })
}

pub fn delivery(c: &mut Conn, s: &Statements, rng: &mut SmallRng, t: &Terminal) -> Result<Effects> {
    let w = t.w;
    let carrier = rng.gen_range(1..=10i64);
    let mut fx = Effects::default();
    c.begin()?;
    for d in 1..=DISTRICTS {
        let Some(row) = c.query(s.dl_oldest, &[w.into(), d.into()])?.into_iter().next() else {
            fx.skipped_districts += 1;
            continue;
        };
        let o_id = row[0].i64()?;
        if c.execute(s.dl_delete, &[w.into(), d.into(), o_id.into()])? == 0 {
            fx.skipped_districts += 1;
            continue;
        }
        let cid = one(c.query(s.dl_order, &[w.into(), d.into(), o_id.into()])?, "order")?[0].i64()?;
        c.execute(s.dl_carrier, &[carrier.into(), w.into(), d.into(), o_id.into()])?;
        c.execute(s.dl_lines, &[w.into(), d.into(), o_id.into()])?;
        let sum = one(c.query(s.dl_sum, &[w.into(), d.into(), o_id.into()])?, "lines")?[0].f64().unwrap_or(0.0);
        c.execute(s.dl_customer, &[sum.into(), w.into(), d.into(), cid.into()])?;
        fx.delivered += 1;
    }
    c.commit()?;
    Ok(fx)
}

pub fn stock_level(c: &mut Conn, s: &Statements, rng: &mut SmallRng, t: &Terminal) -> Result<Effects> {
    let threshold = rng.gen_range(10..=20i64);
    c.begin()?;
    let next = one(c.query(s.sl_next, &[t.w.into(), t.d.into()])?, "district")?[0].i64()?;
    one(c.query(s.sl_count, &[t.w.into(), t.d.into(), next.into(), (next - 20).into(), threshold.into()])?, "stock count")?;
    c.commit()?;
    Ok(Effects::default())
}

/// Run transaction `kind`; on error the open transaction is rolled back.
pub fn run(kind: usize, c: &mut Conn, s: &Statements, rng: &mut SmallRng, t: &Terminal) -> Result<Effects> {
    let r = match kind {
        NEW_ORDER => new_order(c, s, rng, t),
        PAYMENT => payment(c, s, rng, t),
        ORDER_STATUS => order_status(c, s, rng, t),
        DELIVERY => delivery(c, s, rng, t),
        STOCK_LEVEL => stock_level(c, s, rng, t),
        _ => Err(anyhow!("unknown transaction {kind}")),
    };
    if r.is_err() && !c.is_closed() {
        let _ = c.rollback();
    }
    r
}
