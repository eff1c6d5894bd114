//! `chains.LeafQueue` as an indexed 4-ary min-heap: one entry per resident leaf, keyed by its
//! priority log2(CRF) + lam * last tick + bonus at its last (re)queueing and, on a tie, by the order
//! it was queued (the serial). The Python queue keeps stale entries and drops them when met; the
//! leaf it finds is the same.

const NONE: u32 = u32::MAX;
const ARITY: usize = 4;

#[derive(Clone, Copy)]
struct Item {
    priority: f64,
    serial: u32,
    slot: u32,
}

impl Item {
    #[inline]
    fn before(&self, o: &Item) -> bool {
        self.priority < o.priority || (self.priority == o.priority && self.serial < o.serial)
    }
}

pub struct Leaves {
    items: Vec<Item>,
    pos: Vec<u32>, // slot -> index in items, NONE when not queued
    serial: u32,
}

impl Leaves {
    pub fn new(slots: usize) -> Self {
        Leaves {
            items: Vec::new(), // grown as leaves come: a chain has one leaf, often for many blocks
            pos: vec![NONE; slots],
            serial: 0,
        }
    }

    /// (Re)queue `slot` at `priority`, after every leaf queued before it on a tie.
    pub fn set(&mut self, slot: u32, priority: f64) {
        if self.serial == u32::MAX {
            self.renumber();
        }
        self.serial += 1;
        let item = Item {
            priority,
            serial: self.serial,
            slot,
        };
        let at = self.pos[slot as usize];
        if at == NONE {
            self.items.push(item);
            let i = self.items.len() - 1;
            self.pos[slot as usize] = i as u32;
            self.up(i);
        } else {
            let i = at as usize;
            let old = self.items[i];
            self.items[i] = item;
            if item.before(&old) {
                self.up(i);
            } else {
                self.down(i);
            }
        }
    }

    pub fn clear(&mut self) {
        for item in &self.items {
            self.pos[item.slot as usize] = NONE;
        }
        self.items.clear();
    }

    pub fn remove(&mut self, slot: u32) {
        let at = self.pos[slot as usize];
        if at == NONE {
            return;
        }
        let i = at as usize;
        self.pos[slot as usize] = NONE;
        let last = self.items.pop().expect("a queued leaf");
        if i < self.items.len() {
            let old = self.items[i];
            self.items[i] = last;
            self.pos[last.slot as usize] = i as u32;
            if last.before(&old) {
                self.up(i);
            } else {
                self.down(i);
            }
        }
    }

    /// The first leaf in order (-1: none queued).
    pub fn least(&self) -> i64 {
        self.items.first().map_or(-1, |top| top.slot as i64)
    }

    fn renumber(&mut self) {
        let mut order: Vec<usize> = (0..self.items.len()).collect();
        order.sort_by_key(|&i| self.items[i].serial);
        for (n, i) in order.into_iter().enumerate() {
            self.items[i].serial = n as u32 + 1;
        }
        self.serial = self.items.len() as u32;
    }

    fn up(&mut self, mut i: usize) {
        let item = self.items[i];
        while i > 0 {
            let p = (i - 1) / ARITY;
            if !item.before(&self.items[p]) {
                break;
            }
            self.items[i] = self.items[p];
            self.pos[self.items[i].slot as usize] = i as u32;
            i = p;
        }
        self.items[i] = item;
        self.pos[item.slot as usize] = i as u32;
    }

    fn down(&mut self, mut i: usize) {
        let n = self.items.len();
        let item = self.items[i];
        loop {
            let first = ARITY * i + 1;
            if first >= n {
                break;
            }
            let mut c = first;
            for k in first + 1..(first + ARITY).min(n) {
                if self.items[k].before(&self.items[c]) {
                    c = k;
                }
            }
            if !self.items[c].before(&item) {
                break;
            }
            self.items[i] = self.items[c];
            self.pos[self.items[i].slot as usize] = i as u32;
            i = c;
        }
        self.items[i] = item;
        self.pos[item.slot as usize] = i as u32;
    }

    pub fn bytes(&self) -> usize {
        self.items.capacity() * std::mem::size_of::<Item>() + self.pos.len() * 4
    }
}
