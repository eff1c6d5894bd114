//! `chains.LeafQueue`: a lazily pruned min-heap of leaf slots by log2(CRF) + lam * last tick + bonus.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Clone, Copy)]
pub struct Item {
    pub priority: f64,
    pub serial: u64,
    pub slot: u32,
}

impl PartialEq for Item {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Item {
    // Reversed: BinaryHeap pops the greatest, the queue wants the least (priority, serial).
    fn cmp(&self, o: &Self) -> Ordering {
        o.priority.total_cmp(&self.priority).then(o.serial.cmp(&self.serial))
    }
}

#[derive(Default)]
pub struct Leaves {
    pub heap: BinaryHeap<Item>,
    pub serial: u64,
}

impl Leaves {
    pub fn push(&mut self, priority: f64, slot: u32) {
        self.serial += 1;
        self.heap.push(Item { priority, serial: self.serial, slot });
    }

    pub fn bytes(&self) -> usize {
        self.heap.capacity() * std::mem::size_of::<Item>()
    }
}
