/* echo_server: the floor of a query's round trip, a blocking framed echo over a Unix socket.
 *
 *   echo_server SOCKET
 *
 * Listens on SOCKET and serves one connection at a time: reads a 4-byte big-endian length and
 * that many bytes with blocking read(2), writes the same frame back with one write(2). No
 * threads, no event loop, no decoding: what any server must do at least to answer a frame.
 * Exits when SIGTERM arrives.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int read_full(int fd, unsigned char *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k <= 0)
            return -1;
        got += (size_t)k;
    }
    return 0;
}

static void serve(int fd)
{
    size_t cap = 65536;
    unsigned char *buf = malloc(cap);
    while (buf && read_full(fd, buf, 4) == 0) {
        size_t len = (size_t)buf[0] << 24 | (size_t)buf[1] << 16 | (size_t)buf[2] << 8 | buf[3];
        if (len + 4 > cap) {
            unsigned char *bigger = realloc(buf, len + 4);
            if (!bigger)
                break;
            buf = bigger;
            cap = len + 4;
        }
        if (read_full(fd, buf + 4, len) || write(fd, buf, len + 4) != (ssize_t)(len + 4))
            break;
    }
    free(buf);
    close(fd);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s SOCKET\n", argv[0]);
        return 2;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(argv[1]) >= sizeof sa.sun_path) {
        fprintf(stderr, "echo_server: socket path too long: %s\n", argv[1]);
        return 2;
    }
    strcpy(sa.sun_path, argv[1]);
    int ls = socket(AF_UNIX, SOCK_STREAM, 0);
    if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 8)) {
        perror("echo_server");
        return 1;
    }
    for (;;) {
        int fd = accept(ls, NULL, NULL);
        if (fd >= 0)
            serve(fd);
    }
}
