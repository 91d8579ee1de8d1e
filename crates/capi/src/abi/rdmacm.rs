//! rdma_cma.h
