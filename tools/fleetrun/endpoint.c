/* endpoint.c - numeric addresses and endpoints as every part of the launcher handles them:
 * IPv4/IPv6 text to binary and back into socket addresses, "ip:port" / "[ip]:port", and which
 * addresses this machine's interfaces have (how a node finds its entry of --ips, --servers or
 * --workers). No job state: the parts above (args.c, node.c, ps.c, coord.c, lines.c, ...)
 * call it, it calls none of them. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "fleetrun.h"

ip_addr fr_parse_ip(const char *s) {
    ip_addr ip = {0};
    if (inet_pton(AF_INET, s, ip.a) == 1)
        ip.family = AF_INET;
    else if (inet_pton(AF_INET6, s, ip.a) == 1)
        ip.family = AF_INET6;
    return ip;
}

bool fr_ip_equal(ip_addr x, ip_addr y) {
    return x.family == y.family && !memcmp(x.a, y.a, x.family == AF_INET ? 4 : 16);
}

socklen_t fr_sockaddr(ip_addr a, int port, struct sockaddr_storage *ss) {
    memset(ss, 0, sizeof *ss);
    if (a.family == AF_INET) {
        struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
        memcpy(&s4->sin_addr, a.a, 4);
        return sizeof *s4;
    }
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons((uint16_t)port);
    memcpy(&s6->sin6_addr, a.a, 16);
    return sizeof *s6;
}

void fr_format_endpoint(char *out, const char *ip, int port) {
    if (strchr(ip, ':'))
        snprintf(out, ENDPOINT_MAX, "[%s]:%d", ip, port);
    else
        snprintf(out, ENDPOINT_MAX, "%s:%d", ip, port);
}

bool fr_ifaddrs_have(const struct ifaddrs *ifs, ip_addr want) {
    for (const struct ifaddrs *f = ifs; f; f = f->ifa_next) {
        if (!f->ifa_addr)
            continue;
        ip_addr have = {.family = f->ifa_addr->sa_family};
        if (have.family == AF_INET)
            memcpy(have.a, &((struct sockaddr_in *)f->ifa_addr)->sin_addr, 4);
        else if (have.family == AF_INET6)
            memcpy(have.a, &((struct sockaddr_in6 *)f->ifa_addr)->sin6_addr, 16);
        else
            continue;
        if (fr_ip_equal(want, have))
            return true;
    }
    return false;
}

void fr_ifaddrs_ipv4(const struct ifaddrs *ifs, char *out, size_t cap) {
    size_t used = 0;
    out[0] = '\0';
    for (const struct ifaddrs *f = ifs; f; f = f->ifa_next) {
        char s[INET6_ADDRSTRLEN];
        if (!f->ifa_addr || f->ifa_addr->sa_family != AF_INET)
            continue;
        inet_ntop(AF_INET, &((struct sockaddr_in *)f->ifa_addr)->sin_addr, s, sizeof s);
        if (used + strlen(s) + 3 < cap)
            used += (size_t)snprintf(out + used, cap - used, "%s%s", used ? ", " : "", s);
    }
}
