//! verbs.h
