//! Up to four ordered maps over one node slab and one hash index (`collections.OrderedDict`s whose
//! keys never sit in two of them at once): push at either end, move, pop the oldest, remove.

use crate::index::IdMap;

pub const NIL: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Node<V: Copy> {
    key: u64,
    prev: u32,
    next: u32,
    list: u8,
    val: V,
}

pub struct Lists<V: Copy> {
    nodes: Vec<Node<V>>,
    free: Vec<u32>,
    index: IdMap<u32>, // key (as i64) -> node
    heads: [u32; 4],
    tails: [u32; 4],
    lens: [usize; 4],
}

impl<V: Copy> Default for Lists<V> {
    fn default() -> Self {
        Lists {
            nodes: Vec::new(),
            free: Vec::new(),
            index: IdMap::default(),
            heads: [NIL; 4],
            tails: [NIL; 4],
            lens: [0; 4],
        }
    }
}

impl<V: Copy> Lists<V> {
    #[inline]
    pub fn find(&self, key: u64) -> Option<u32> {
        self.index.get(&(key as i64)).copied()
    }

    /// The list `key` is in.
    #[inline]
    pub fn which(&self, key: u64) -> Option<u8> {
        self.find(key).map(|i| self.nodes[i as usize].list)
    }

    #[inline]
    pub fn list(&self, i: u32) -> u8 {
        self.nodes[i as usize].list
    }

    #[inline]
    pub fn key(&self, i: u32) -> u64 {
        self.nodes[i as usize].key
    }

    #[inline]
    pub fn val(&self, i: u32) -> V {
        self.nodes[i as usize].val
    }

    #[inline]
    pub fn val_mut(&mut self, i: u32) -> &mut V {
        &mut self.nodes[i as usize].val
    }

    #[inline]
    pub fn len(&self, list: u8) -> usize {
        self.lens[list as usize]
    }

    pub fn total(&self) -> usize {
        self.index.len()
    }

    #[inline]
    pub fn front(&self, list: u8) -> Option<u32> {
        let h = self.heads[list as usize];
        (h != NIL).then_some(h)
    }

    /// The node after `i` in its list (towards the newest).
    #[inline]
    pub fn next(&self, i: u32) -> Option<u32> {
        let n = self.nodes[i as usize].next;
        (n != NIL).then_some(n)
    }

    fn unlink(&mut self, i: u32) {
        let Node {
            prev, next, list, ..
        } = self.nodes[i as usize];
        let l = list as usize;
        if prev == NIL {
            self.heads[l] = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.tails[l] = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
        self.lens[l] -= 1;
    }

    fn link_back(&mut self, i: u32, list: u8) {
        let l = list as usize;
        let tail = self.tails[l];
        {
            let n = &mut self.nodes[i as usize];
            n.list = list;
            n.prev = tail;
            n.next = NIL;
        }
        if tail == NIL {
            self.heads[l] = i;
        } else {
            self.nodes[tail as usize].next = i;
        }
        self.tails[l] = i;
        self.lens[l] += 1;
    }

    fn link_front(&mut self, i: u32, list: u8) {
        let l = list as usize;
        let head = self.heads[l];
        {
            let n = &mut self.nodes[i as usize];
            n.list = list;
            n.prev = NIL;
            n.next = head;
        }
        if head == NIL {
            self.tails[l] = i;
        } else {
            self.nodes[head as usize].prev = i;
        }
        self.heads[l] = i;
        self.lens[l] += 1;
    }

    fn alloc(&mut self, key: u64, val: V) -> u32 {
        let node = Node {
            key,
            prev: NIL,
            next: NIL,
            list: 0,
            val,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        let old = self.index.insert(key as i64, i);
        debug_assert!(old.is_none(), "a key in two lists");
        i
    }

    /// Appends `key` (in no list yet) as the newest of `list`.
    pub fn push_back(&mut self, list: u8, key: u64, val: V) -> u32 {
        let i = self.alloc(key, val);
        self.link_back(i, list);
        i
    }

    /// Puts `key` (in no list yet) first (oldest) in `list`.
    pub fn push_front(&mut self, list: u8, key: u64, val: V) -> u32 {
        let i = self.alloc(key, val);
        self.link_front(i, list);
        i
    }

    /// Moves node `i` to the newest end of `list` (its own or another).
    pub fn move_back(&mut self, i: u32, list: u8) {
        self.unlink(i);
        self.link_back(i, list);
    }

    pub fn remove(&mut self, i: u32) -> (u64, V) {
        self.unlink(i);
        let Node { key, val, .. } = self.nodes[i as usize];
        self.index.remove(&(key as i64));
        self.free.push(i);
        (key, val)
    }

    pub fn pop_front(&mut self, list: u8) -> Option<(u64, V)> {
        self.front(list).map(|i| self.remove(i))
    }

    pub fn bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node<V>>()
            + self.free.capacity() * 4
            + self.index.capacity() * 13
    }
}
