//! Values under small stable keys (`SeqKey`), the slot of a removed value reused by the next
//! insert: the sequences of `Scheduler` and the inputs of `PrefillScheduler`.

use std::ops::{Index, IndexMut};

use super::rank::SeqKey;

/// `slots[key]` is the value under `key`, or None once removed (until the key is reused).
#[derive(Debug)]
pub(crate) struct Slab<T> {
    slots: Vec<Option<T>>,
    free: Vec<SeqKey>,
}

impl<T> Slab<T> {
    pub fn new() -> Self {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }

    /// Stores `value` under a free key (a removed one first).
    pub fn insert(&mut self, value: T) -> SeqKey {
        match self.free.pop() {
            Some(key) => {
                self.slots[key as usize] = Some(value);
                key
            }
            None => {
                self.slots.push(Some(value));
                (self.slots.len() - 1) as SeqKey
            }
        }
    }

    /// The value under `key`, taken out; its key is free again.
    pub fn remove(&mut self, key: SeqKey) -> Option<T> {
        let value = self.slots[key as usize].take();
        if value.is_some() {
            self.free.push(key);
        }
        value
    }

    /// Slots ever used (live or free).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Every slot, by key.
    pub fn iter(&self) -> std::slice::Iter<'_, Option<T>> {
        self.slots.iter()
    }

    /// Every slot, by key, mutably.
    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, Option<T>> {
        self.slots.iter_mut()
    }
}

impl<T> Index<usize> for Slab<T> {
    type Output = Option<T>;

    fn index(&self, key: usize) -> &Option<T> {
        &self.slots[key]
    }
}

impl<T> IndexMut<usize> for Slab<T> {
    fn index_mut(&mut self, key: usize) -> &mut Option<T> {
        &mut self.slots[key]
    }
}
