//! (being written)
pub fn main(_args: Vec<std::ffi::OsString>) -> i32 { 0 }
