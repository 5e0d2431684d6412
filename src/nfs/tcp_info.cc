#include "nfs/tcp_info.h"

#include <linux/tcp.h>
#include <stddef.h>
#include <netinet/in.h>
#include <sys/socket.h>

namespace mpnfs::nfs {

uint64_t TcpDeliveryRate(int fd) {
  tcp_info ti{};
  socklen_t len = sizeof(ti);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return 0;
  // An older kernel's shorter struct: no delivery rate.
  if (len < offsetof(tcp_info, tcpi_delivery_rate) + sizeof(ti.tcpi_delivery_rate)) return 0;
  if (ti.tcpi_delivery_rate_app_limited) return 0;
  return ti.tcpi_delivery_rate;
}

int64_t TcpSilentMs(int fd) {
  tcp_info ti{};
  socklen_t len = sizeof(ti);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return -1;
  // Window shut with nothing of ours in flight: TCP is probing the window
  // (the persist timer), and the peer has answered every probe but at most
  // the one just sent.
  if (len >= offsetof(tcp_info, tcpi_snd_wnd) + sizeof(ti.tcpi_snd_wnd) && ti.tcpi_snd_mss > 0 &&
      ti.tcpi_snd_wnd < ti.tcpi_snd_mss && ti.tcpi_unacked == 0 && ti.tcpi_probes <= 1) {
    return 0;
  }
  return ti.tcpi_last_ack_recv < ti.tcpi_last_data_recv ? ti.tcpi_last_ack_recv : ti.tcpi_last_data_recv;
}

}  // namespace mpnfs::nfs
