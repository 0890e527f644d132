/* comm/gloo_shim.cc: the thinnest C++ keel has — Gloo's TCP transport,
 * rendezvous and unbound buffers behind gloo_shim.h's three C calls. Gloo is
 * C++ only (Debian's libgloo-dev); every exception stops here. */
#include "comm/gloo_shim.h"

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

struct keel_gloo {
    std::shared_ptr<gloo::rendezvous::Context> context;
};

/* keel's store behind Gloo's interface: a key that is not there yet is
 * polled for until the timeout (Gloo's own stores wait the same way). */
class CallbackStore : public gloo::rendezvous::Store {
  public:
    CallbackStore(const keel_gloo_store &s, std::chrono::milliseconds timeout) : s_(s), timeout_(timeout) {}
    void set(const std::string &key, const std::vector<char> &data) override {
        if (s_.set(s_.ctx, key.c_str(), data.data(), data.size()) != 0)
            throw std::runtime_error("the store could not set " + key);
    }
    std::vector<char> get(const std::string &key) override {
        auto deadline = std::chrono::steady_clock::now() + timeout_;
        std::vector<char> value(256);
        for (;;) {
            size_t n = 0;
            int got = s_.get(s_.ctx, key.c_str(), value.data(), value.size(), &n);
            if (got < 0) throw std::runtime_error("the store could not get " + key);
            if (got == 1 && n <= value.size()) {
                value.resize(n);
                return value;
            }
            if (got == 1) {
                value.resize(n);
                continue;
            }
            if (std::chrono::steady_clock::now() > deadline)
                throw std::runtime_error("no rank wrote " + key + " in time: a rank of this attempt never started");
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    }
    void wait(const std::vector<std::string> &keys) override { wait(keys, timeout_); }
    void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &) override {
        for (const auto &key : keys) get(key);
    }

  private:
    keel_gloo_store s_;
    std::chrono::milliseconds timeout_;
};

static void say(char *err, size_t err_n, const char *what, const std::exception &e) {
    std::snprintf(err, err_n, "%s: %s", what, e.what());
}

extern "C" keel_gloo *keel_gloo_connect(const keel_gloo_store *callbacks, const char *store_dir, const char *prefix,
                                        const char *host, int rank, int size, double connect_s, char *err,
                                        size_t err_n) {
    try {
        gloo::transport::tcp::attr attr;
        char name[256] = {0};
        if (host && host[0]) attr.hostname = host;
        else if (gethostname(name, sizeof name - 1) == 0) attr.hostname = name;
        auto device = gloo::transport::tcp::CreateDevice(attr);
        std::chrono::milliseconds timeout((long long)(connect_s * 1000));
        std::unique_ptr<gloo::rendezvous::Store> base;
        if (callbacks) base.reset(new CallbackStore(*callbacks, timeout));
        else base.reset(new gloo::rendezvous::FileStore(store_dir));
        gloo::rendezvous::PrefixStore store(prefix, *base);
        auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
        context->setTimeout(timeout);
        context->connectFullMesh(store, device);
        /* a peer may compute for hours between two collectives: a wait ends when
         * the data comes or its connection closes, never on a clock (a hung peer
         * is the supervisor's to find) */
        context->setTimeout(std::chrono::hours(24 * 365));
        return new keel_gloo{context};
    } catch (const std::exception &e) {
        say(err, err_n, "connecting the ranks", e);
        return nullptr;
    }
}

extern "C" int keel_gloo_exchange(keel_gloo *g, const void *send, size_t send_bytes, int dest, void *recv,
                                  size_t recv_bytes, int source, uint64_t slot, char *err, size_t err_n) {
    static char none; /* Gloo wants a buffer even for 0 bytes */
    int failed = -1;  /* the wait that threw names the peer that was lost: source, then dest */
    try {
        std::unique_ptr<gloo::transport::UnboundBuffer> out, in;
        if (dest >= 0) {
            out = g->context->createUnboundBuffer(send_bytes ? const_cast<void *>(send) : &none, send_bytes);
            out->send(dest, slot);
        }
        if (source >= 0) {
            in = g->context->createUnboundBuffer(recv_bytes ? recv : &none, recv_bytes);
            in->recv(source, slot);
        }
        failed = source;
        if (in) in->waitRecv();
        failed = dest;
        if (out) out->waitSend();
        return -1;
    } catch (const std::exception &e) {
        say(err, err_n, "gloo", e);
        return failed >= 0 ? failed : (dest >= 0 ? dest : source);
    }
}

extern "C" void keel_gloo_close(keel_gloo *g) { delete g; }
