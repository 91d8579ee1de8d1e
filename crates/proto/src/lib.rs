//! Sans-IO state machines of softrdma: the InfiniBand transport (RC, UC, UD) and the
//! connection manager, driven by packets, posted work and the current time, with no sockets,
//! threads or clock reads of their own.
