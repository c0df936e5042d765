//! Locks over plain data, which a panic elsewhere never poisons for good.
//!
//! Every mutex here guards data that each critical section leaves
//! consistent (a map updated in one operation, a counter, a list pushed to),
//! so a panic while one was held says nothing about the data: it is used as
//! it is, instead of cascading the panic into every later caller.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, poisoned or not.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The data of a mutex no one else holds any more, poisoned or not.
pub fn into_inner<T>(mutex: Mutex<T>) -> T {
    mutex.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner())
}
