//! softrdma
