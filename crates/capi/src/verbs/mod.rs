//! libibverbs
