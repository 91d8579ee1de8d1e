/*
 * The loopback's UDP ping-pong floor with the system calls softrdma's wire path uses, one
 * variant at a time: two threads (pinned to CPUs 0 and 1) busy-poll non-blocking sockets on
 * 127.77.1.1/127.77.1.2; 100,000 round trips of one 60-byte datagram each way; prints the
 * one-way p50 and minimum (half the round trip).
 *
 *   gcc -O2 -pthread -o /tmp/udp_recv_variants scripts/probes/udp_recv_variants.c
 *   /tmp/udp_recv_variants MODE [VLEN]
 *
 * MODE is a sum of: 1 receive with recvmmsg (VLEN messages, each with a source address and a
 * 32-byte control buffer) instead of recv; 2 UDP_GRO on both sockets; 4 send with sendmmsg
 * instead of sendto; 8 send a second, smaller datagram behind the first in that sendmmsg (an
 * ACK behind an answer); 16 receive with one recvmsg (address and control buffer); 32 send
 * the two datagrams of 8 as one UDP GSO message (UDP_SEGMENT 60: what softrdma's batch does
 * with an answer and its ACK to one loopback peer).
 * BENCHMARKS.md (2026-11-27 21:50 UTC) has what it measured and why softrdma kept its system
 * calls all the same (a polling program must take an answer and its ACK in one look).
 */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define N 100000
#define UDP_GRO_OPT 104
#define UDP_SEGMENT_OPT 103

static int mode, vlen = 64;
static int sock_a, sock_b;
static struct sockaddr_in addr_a, addr_b;

struct io {
    struct mmsghdr m[64];
    struct iovec iov[64];
    struct sockaddr_storage names[64];
    char control[64][32];
    char buf[64][2048];
    struct mmsghdr sm[2];
    struct iovec siov[2];
    char sbuf[2][64];
    struct msghdr gso;
    char gso_control[64];
};

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void setup(struct io *x, struct sockaddr_in *to) {
    for (int i = 0; i < 64; i++) {
        x->iov[i].iov_base = x->buf[i];
        x->iov[i].iov_len = sizeof x->buf[i];
        x->m[i].msg_hdr.msg_iov = &x->iov[i];
        x->m[i].msg_hdr.msg_iovlen = 1;
        x->m[i].msg_hdr.msg_name = &x->names[i];
        x->m[i].msg_hdr.msg_control = x->control[i];
    }
    for (int i = 0; i < 2; i++) {
        x->siov[i].iov_base = x->sbuf[i];
        x->siov[i].iov_len = i ? 48 : 60;
        memset(&x->sm[i], 0, sizeof x->sm[i]);
        x->sm[i].msg_hdr.msg_iov = &x->siov[i];
        x->sm[i].msg_hdr.msg_iovlen = 1;
        x->sm[i].msg_hdr.msg_name = to;
        x->sm[i].msg_hdr.msg_namelen = sizeof *to;
    }
    x->sbuf[0][0] = 'D'; /* the data datagram */
    x->sbuf[1][0] = 'A'; /* the one behind it */
    /* Both in one GSO message: segments of 60 bytes, the second 48. */
    memset(&x->gso, 0, sizeof x->gso);
    x->gso.msg_name = to;
    x->gso.msg_namelen = sizeof *to;
    x->gso.msg_iov = x->siov;
    x->gso.msg_iovlen = 2;
    x->gso.msg_control = x->gso_control;
    x->gso.msg_controllen = CMSG_SPACE(sizeof(unsigned short));
    struct cmsghdr *cm = CMSG_FIRSTHDR(&x->gso);
    cm->cmsg_level = IPPROTO_UDP;
    cm->cmsg_type = UDP_SEGMENT_OPT;
    cm->cmsg_len = CMSG_LEN(sizeof(unsigned short));
    unsigned short seg = 60;
    memcpy(CMSG_DATA(cm), &seg, sizeof seg);
}

/* Busy-polls until the data datagram arrives. */
static void receive(int s, struct io *x) {
    for (;;) {
        for (int i = 0; i < 64; i++) {
            x->m[i].msg_hdr.msg_namelen = sizeof x->names[i];
            x->m[i].msg_hdr.msg_controllen = sizeof x->control[i];
        }
        if (mode & 16) {
            if (recvmsg(s, &x->m[0].msg_hdr, MSG_DONTWAIT) > 0 && x->buf[0][0] == 'D')
                return;
        } else if (mode & 1) {
            int r = recvmmsg(s, x->m, vlen, MSG_DONTWAIT, NULL);
            for (int i = 0; i < r; i++)
                if (x->buf[i][0] == 'D')
                    return;
        } else if (recv(s, x->buf[0], sizeof x->buf[0], MSG_DONTWAIT) > 0 && x->buf[0][0] == 'D') {
            return;
        }
    }
}

static void send_one(int s, struct io *x, struct sockaddr_in *to) {
    if (mode & 32) {
        struct mmsghdr m = {.msg_hdr = x->gso};
        sendmmsg(s, &m, 1, 0);
    } else if (mode & 4)
        sendmmsg(s, x->sm, (mode & 8) ? 2 : 1, 0);
    else
        sendto(s, x->sbuf[0], 60, 0, (struct sockaddr *)to, sizeof *to);
}

static void *server(void *unused) {
    (void)unused;
    pin(0);
    struct io *x = calloc(1, sizeof *x);
    setup(x, &addr_a);
    for (int i = 0; i < N; i++) {
        receive(sock_b, x);
        send_one(sock_b, x, &addr_a);
    }
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODE [VLEN]\n", argv[0]);
        return 2;
    }
    mode = atoi(argv[1]);
    if (argc > 2)
        vlen = atoi(argv[2]);
    if (vlen < 1 || vlen > 64)
        vlen = 64;
    int port = 40000 + (int)(now_ns() / 1000) % 20000;
    sock_a = socket(AF_INET, SOCK_DGRAM, 0);
    sock_b = socket(AF_INET, SOCK_DGRAM, 0);
    addr_a = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons(port),
                                  .sin_addr.s_addr = htonl(0x7f4d0101)};
    addr_b = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons(port + 1),
                                  .sin_addr.s_addr = htonl(0x7f4d0102)};
    if (bind(sock_a, (struct sockaddr *)&addr_a, sizeof addr_a) ||
        bind(sock_b, (struct sockaddr *)&addr_b, sizeof addr_b)) {
        perror("bind");
        return 1;
    }
    if (mode & 2) {
        int one = 1;
        setsockopt(sock_a, IPPROTO_UDP, UDP_GRO_OPT, &one, sizeof one);
        setsockopt(sock_b, IPPROTO_UDP, UDP_GRO_OPT, &one, sizeof one);
    }
    pthread_t t;
    pthread_create(&t, NULL, server, NULL);
    pin(1);
    struct io *x = calloc(1, sizeof *x);
    setup(x, &addr_b);
    double *lat = malloc(N * sizeof *lat);
    for (int i = 0; i < N; i++) {
        double t0 = now_ns();
        send_one(sock_a, x, &addr_b);
        receive(sock_a, x);
        lat[i] = (now_ns() - t0) / 2000.0;
    }
    pthread_join(t, NULL);
    qsort(lat, N, sizeof *lat, cmp);
    printf("receive %s (vlen %d), GRO %s, send %s, %d datagram(s): one-way p50 %.2f us, min %.2f us\n",
           (mode & 16) ? "recvmsg" : (mode & 1) ? "recvmmsg" : "recv", (mode & 1) ? vlen : 1,
           (mode & 2) ? "on" : "off",
           (mode & 32) ? "sendmmsg, one GSO message" : (mode & 4) ? "sendmmsg" : "sendto",
           (mode & 40) ? 2 : 1, lat[N / 2], lat[0]);
    return 0;
}
