//! librdmacm
