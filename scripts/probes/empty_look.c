/*
 * What a busy-polling receiver's look at an empty UDP socket costs, one system call at a
 * time: a non-blocking socket bound to 127.0.0.9 with UDP_GRO on, 10^6 calls of each, three
 * rounds, ns per call. `recvmmsg` of one message with a source address and a control buffer
 * is what softrdma's narrow look asks; `getppid` is the bare cost of a system call.
 *
 *   gcc -O2 -o /tmp/empty_look scripts/probes/empty_look.c && /tmp/empty_look
 *
 * (BENCHMARKS.md, "A poll that finds the receive side taken yields the CPU".)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define UDP_GRO_OPT 104

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(void) {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(40999)};
    inet_pton(AF_INET, "127.0.0.9", &a.sin_addr);
    if (bind(s, (struct sockaddr *)&a, sizeof a)) {
        perror("bind");
        return 1;
    }
    int one = 1;
    setsockopt(s, IPPROTO_UDP, UDP_GRO_OPT, &one, sizeof one);
    char buf[2048], ctl[64];
    struct sockaddr_storage name;
    struct iovec iov = {buf, sizeof buf};
    struct mmsghdr m = {.msg_hdr = {.msg_name = &name, .msg_iov = &iov, .msg_iovlen = 1,
                                    .msg_control = ctl}};
    const int n = 1000000;
    for (int r = 0; r < 3; r++) {
        double t = now_ns();
        for (int i = 0; i < n; i++) {
            m.msg_hdr.msg_namelen = sizeof name;
            m.msg_hdr.msg_controllen = sizeof ctl;
            recvmmsg(s, &m, 1, MSG_DONTWAIT, NULL);
        }
        printf("recvmmsg (1, name, control) %.0f ns\n", (now_ns() - t) / n);
        t = now_ns();
        for (int i = 0; i < n; i++) {
            m.msg_hdr.msg_namelen = sizeof name;
            m.msg_hdr.msg_controllen = sizeof ctl;
            recvmsg(s, &m.msg_hdr, MSG_DONTWAIT);
        }
        printf("recvmsg (name, control) %.0f ns\n", (now_ns() - t) / n);
        t = now_ns();
        for (int i = 0; i < n; i++) {
            socklen_t l = sizeof name;
            recvfrom(s, buf, sizeof buf, MSG_DONTWAIT, (struct sockaddr *)&name, &l);
        }
        printf("recvfrom %.0f ns\n", (now_ns() - t) / n);
        t = now_ns();
        for (int i = 0; i < n; i++)
            recv(s, buf, sizeof buf, MSG_DONTWAIT);
        printf("recv %.0f ns\n", (now_ns() - t) / n);
        t = now_ns();
        for (int i = 0; i < n; i++) {
            int q;
            ioctl(s, FIONREAD, &q);
        }
        printf("ioctl(FIONREAD) %.0f ns\n", (now_ns() - t) / n);
        struct pollfd p = {s, POLLIN, 0};
        t = now_ns();
        for (int i = 0; i < n; i++)
            poll(&p, 1, 0);
        printf("poll (no timeout) %.0f ns\n", (now_ns() - t) / n);
        t = now_ns();
        for (int i = 0; i < n; i++)
            getppid();
        printf("getppid %.0f ns\n", (now_ns() - t) / n);
    }
    return 0;
}
