"""The Foxglove WebSocket protocol served from our own aiohttp server, under the shared
web policy (visionipc/apps/web: Host, Origin, the owner's token, connection limit and
timeouts, escaped rate-limited log).

Protocol (https://github.com/foxglove/ws-protocol/blob/main/docs/spec.md, v1), subprotocol
``foxglove.websocket.v1`` or ``foxglove.sdk.v1`` (the same messages): on connect the server
sends ``serverInfo`` and ``advertise`` (one channel per stream or topic); the client sends
``subscribe`` ({id, channelId}...) and ``unsubscribe`` (subscriptionIds); each message of a
subscribed channel is a binary ``messageData``: opcode 1, uint32 subscription id, uint64 log
time (ns), payload. Anything else from the client is answered with a ``status`` error.

Per-client queues keep only the newest (``Client.offer``): an image channel holds one
message per client (a newer frame replaces it; the older one is dropped and counted), a
video channel at most VIDEO_QUEUE (more: all dropped, and the client waits for a keyframe
it asks the encoder for, so it never decodes a broken chain), a raw topic RAW_QUEUE
messages / bytes (oldest dropped). Messages are shared, never copied per client.

Flow control: each message is followed by a WebSocket ping; a client has at most
IN_FLIGHT messages not yet acknowledged by its pong (every WebSocket client answers pings
as it reads: RFC 6455). So a stuck client holds one message, not a backlog, and a slow one
is handed the newest frame when it is ready for one. A client that acknowledges nothing
for ``client_timeout`` s (``--client-timeout``, default ACK_TIMEOUT_S) is closed.

Threads: pumps call ``Hub.publish`` from their own threads; everything else runs on the
event loop (``publish`` hands over with call_soon_threadsafe). ``Channel.subscribers``
is read by pumps only as a count (skip encoding when nobody watches).
"""

import asyncio
import base64
import collections
import json
import struct
import threading
import time
from typing import TYPE_CHECKING, Any, Deque, Dict, Iterable, List, NamedTuple, Optional, Set, TypedDict

from aiohttp import WSMsgType, web

if TYPE_CHECKING:
    from aiohttp.typedefs import Middleware

    from visionipc.apps.web.peerlog import PeerLog

SUBPROTOCOLS = ("foxglove.sdk.v1", "foxglove.websocket.v1")
MESSAGE_DATA = struct.Struct("<BIQ")  # opcode 1, subscription id, log time ns
PING = struct.Struct("<Q")
IN_FLIGHT = 1  # messages sent to a client and not yet acknowledged by its pong
ACK_TIMEOUT_S = 30.0
VIDEO_QUEUE = 8
RAW_QUEUE = (256, 4 << 20)  # messages, bytes
MAX_CLIENT_MESSAGE = 64 << 10
MAX_BAD_MESSAGES = 100  # then the client is closed (1008 policy violation)
ERROR = 2  # status level
# Channel.kind, which sets how a slow client's queue drops (Client.offer)
IMAGE_CHANNEL, VIDEO_CHANNEL, RAW_CHANNEL = "image", "video", "raw"


class Message(NamedTuple):
    order: int  # hub-wide arrival order
    log_time: int
    payload: bytes
    keyframe: bool


class ChannelAdvert(TypedDict):
    """A channel as ``advertise`` lists it."""

    id: int
    topic: str
    encoding: str
    schemaName: str
    schemaEncoding: str
    schema: str


class SubscriptionReport(TypedDict):
    topic: str
    sent: int
    dropped: int
    queued: int


class ClientReport(TypedDict):
    """A client as ``/stats`` shows it."""

    peer: str
    in_flight: int
    subscriptions: List[SubscriptionReport]


class Channel:
    """One advertised channel; ``kind``: image (newest only), video (H.264: keyframes
    matter) or raw (msgq topic: a small queue)."""

    def __init__(
        self,
        channel_id: int,
        topic: str,
        kind: str,
        encoding: str,
        schema_name: str,
        schema_encoding: str = "",
        schema: bytes = b"",
    ) -> None:
        self.id, self.topic, self.kind = channel_id, topic, kind
        self.encoding, self.schema_name, self.schema_encoding = encoding, schema_name, schema_encoding
        binary = schema_encoding in ("protobuf", "flatbuffer")  # the protocol carries these base64
        self.schema = base64.b64encode(schema).decode() if binary else schema.decode(errors="replace")
        self.subscribers: Set[Subscription] = set()
        self.keyframe_wanted = threading.Event()  # video: set here, cleared by the pump that encodes one

    def advert(self) -> ChannelAdvert:
        return {
            "id": self.id,
            "topic": self.topic,
            "encoding": self.encoding,
            "schemaName": self.schema_name,
            "schemaEncoding": self.schema_encoding,
            "schema": self.schema,
        }


class Subscription:
    def __init__(self, sub_id: int, channel: Channel, client: "Client") -> None:
        self.id, self.channel, self.client = sub_id, channel, client
        self.queue: Deque[Message] = collections.deque()
        self.bytes = 0
        self.sent = self.dropped = 0
        self.need_keyframe = channel.kind == VIDEO_CHANNEL

    def report(self) -> SubscriptionReport:
        return {"topic": self.channel.topic, "sent": self.sent, "dropped": self.dropped, "queued": len(self.queue)}


class Client:
    """One WebSocket connection: its subscriptions, their queues, its sender task."""

    def __init__(
        self, hub: "Hub", ws: web.WebSocketResponse, peer: str, transport: Optional[asyncio.Transport]
    ) -> None:
        self.hub, self.ws, self.peer, self.transport = hub, ws, peer, transport
        self.subs: Dict[int, Subscription] = {}  # subscription id -> Subscription
        self.wake = asyncio.Event()
        self.pings = self.acked = 0
        self.waiting_since = time.monotonic()  # of the oldest message not yet acknowledged
        self.started = time.monotonic()
        self.bad = 0
        self.closed = False

    # -- queues (event loop) --------------------------------------------------------

    def offer(self, sub: Subscription, msg: Message) -> None:
        """Queue ``msg`` for ``sub``, dropping (and counting) what it makes stale."""
        kind, queue = sub.channel.kind, sub.queue
        if kind == IMAGE_CHANNEL:
            sub.dropped += len(queue)
            queue.clear()
            sub.bytes = 0
        elif kind == VIDEO_CHANNEL:
            if sub.need_keyframe and not msg.keyframe:
                sub.dropped += 1
                return
            if len(queue) >= VIDEO_QUEUE:  # too far behind: skip to the next keyframe
                sub.dropped += len(queue) + 1
                queue.clear()
                sub.bytes = 0
                sub.need_keyframe = True
                sub.channel.keyframe_wanted.set()
                return
            sub.need_keyframe = False
        queue.append(msg)
        sub.bytes += len(msg.payload)
        while kind == RAW_CHANNEL and (len(queue) > RAW_QUEUE[0] or sub.bytes > RAW_QUEUE[1]):
            sub.bytes -= len(queue.popleft().payload)
            sub.dropped += 1
        self.wake.set()

    def _next(self) -> Optional[Subscription]:
        """The subscription whose oldest queued message came first, or None."""
        ready = [s for s in self.subs.values() if s.queue]
        return min(ready, key=lambda s: s.queue[0].order) if ready else None

    async def send_loop(self) -> None:
        while not self.closed:
            try:
                await asyncio.wait_for(self.wake.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
            self.wake.clear()
            timeout = self.hub.client_timeout
            if self.pings > self.acked and time.monotonic() - self.waiting_since > timeout:
                self.hub.log.say(f"client {self.peer} read nothing in {timeout:g} s (stuck): closed")
                self.abort()
                return
            while self.pings - self.acked < IN_FLIGHT and (sub := self._next()) is not None:
                msg = sub.queue.popleft()
                sub.bytes -= len(msg.payload)
                header = MESSAGE_DATA.pack(1, sub.id, msg.log_time)
                try:
                    if self.pings == self.acked:
                        self.waiting_since = time.monotonic()
                    await asyncio.wait_for(self.ws.send_bytes(header + msg.payload), timeout)
                    self.pings += 1
                    await asyncio.wait_for(self.ws.ping(PING.pack(self.pings)), timeout)
                except (ConnectionError, RuntimeError, asyncio.TimeoutError):
                    self.abort()
                    return
                sub.sent += 1

    def acknowledge(self, data: bytes) -> None:
        if len(data) == PING.size:
            (n,) = PING.unpack(data)
            if self.acked < n <= self.pings:
                self.acked, self.waiting_since = n, time.monotonic()
                self.wake.set()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # -- what the client says (event loop) ------------------------------------------

    async def status(self, message: str) -> None:
        await self.ws.send_str(json.dumps({"op": "status", "level": ERROR, "message": message}))

    async def bad_message(self, why: str) -> None:
        self.bad += 1
        if self.bad == 1:
            self.hub.log.say(f"client {self.peer}: {why} (answered with a status; later ones only counted)")
        if self.bad > MAX_BAD_MESSAGES:
            self.hub.log.say(f"client {self.peer}: more than {MAX_BAD_MESSAGES} invalid messages: closed")
            await self.ws.close(code=1008, message=b"too many invalid messages")
            return
        await self.status(why[:300])

    async def on_text(self, text: str) -> None:
        try:
            msg = json.loads(text)
        except ValueError:
            return await self.bad_message(f"invalid message (not JSON): {text[:80]!r}")
        op = msg.get("op") if isinstance(msg, dict) else None
        if op == "subscribe":
            return await self.subscribe(msg.get("subscriptions"))
        if op == "unsubscribe":
            return await self.unsubscribe(msg.get("subscriptionIds"))
        return await self.bad_message(f"unsupported op {str(op)[:40]!r} (this server only streams channels)")

    async def subscribe(self, items: object) -> None:
        if not isinstance(items, list):
            return await self.bad_message("subscribe wants a list 'subscriptions' of {id, channelId}")
        for item in items:
            sub_id = item.get("id") if isinstance(item, dict) else None
            # any JSON value: one that is not a channel's id finds none
            channel = self.hub.channels.get(item.get("channelId")) if isinstance(item, dict) else None  # type: ignore[arg-type]
            if not isinstance(sub_id, int) or not 0 <= sub_id < 2**32:
                await self.bad_message(f"subscription id {str(sub_id)[:20]!r} is not a uint32")
            elif channel is None:
                await self.bad_message(f"unknown channel id {str(item.get('channelId'))[:20]!r}")
            elif sub_id in self.subs:
                await self.bad_message(f"subscription id {sub_id} is in use")
            elif any(s.channel is channel for s in self.subs.values()):
                await self.bad_message(f"channel {channel.id} is already subscribed")
            else:
                sub = Subscription(sub_id, channel, self)
                self.subs[sub_id] = sub
                channel.subscribers.add(sub)
                if channel.kind == VIDEO_CHANNEL:  # it decodes from a keyframe: ask for one now
                    channel.keyframe_wanted.set()

    async def unsubscribe(self, ids: object) -> None:
        if not isinstance(ids, list):
            return await self.bad_message("unsubscribe wants a list 'subscriptionIds'")
        for sub_id in ids:
            sub = self.subs.pop(sub_id, None) if isinstance(sub_id, int) else None
            if sub is None:
                await self.bad_message(f"unknown subscription id {str(sub_id)[:20]!r}")
            else:
                sub.channel.subscribers.discard(sub)

    def leave(self) -> None:
        self.closed = True
        for sub in self.subs.values():
            sub.channel.subscribers.discard(sub)

    def report(self) -> ClientReport:
        return {
            "peer": self.peer,
            "in_flight": self.pings - self.acked,
            "subscriptions": [s.report() for s in self.subs.values()],
        }


class Hub:
    """The channels, the connected clients, and the aiohttp handlers."""

    def __init__(self, prog: str, log: "PeerLog", client_timeout: float = ACK_TIMEOUT_S) -> None:
        self.prog, self.log, self.client_timeout = prog, log, client_timeout
        self.channels: Dict[int, Channel] = {}
        self.clients: Set[Client] = set()
        self.loop: Optional[asyncio.AbstractEventLoop] = None  # set once the server runs
        self.order = 0
        self.dropped_by_gone = 0  # dropped counts of clients that left
        self.session = str(time.time_ns())

    def add_channel(
        self, topic: str, kind: str, encoding: str, schema_name: str, schema_encoding: str = "", schema: bytes = b""
    ) -> Channel:
        channel = Channel(len(self.channels) + 1, topic, kind, encoding, schema_name, schema_encoding, schema)
        self.channels[channel.id] = channel
        return channel

    # -- from pump threads ------------------------------------------------------------

    def publish(self, channel: Channel, log_time: int, payload: bytes, keyframe: bool = True) -> None:
        loop = self.loop
        assert loop is not None, "publish() before the server started"
        try:
            loop.call_soon_threadsafe(self._publish, channel, log_time, payload, keyframe)
        except RuntimeError:  # the loop is closing
            pass

    def _publish(self, channel: Channel, log_time: int, payload: bytes, keyframe: bool) -> None:
        self.order += 1
        msg = Message(self.order, log_time, payload, keyframe)
        for sub in list(channel.subscribers):
            sub.client.offer(sub, msg)

    # -- handlers ---------------------------------------------------------------------

    def app(self, middlewares: Iterable["Middleware"]) -> web.Application:
        app = web.Application(middlewares=middlewares)
        app.add_routes([web.get("/", self.connect), web.get("/stats", self.stats)])
        app.on_startup.append(self._started)
        return app

    async def _started(self, app: web.Application) -> None:
        self.loop = asyncio.get_running_loop()

    async def stats(self, request: web.Request) -> web.Response:
        clients = [c.report() for c in self.clients]
        dropped = self.dropped_by_gone + sum(s["dropped"] for c in clients for s in c["subscriptions"])
        body: Dict[str, Any] = {
            "channels": [c.topic for c in self.channels.values()],
            "clients": clients,
            "dropped": dropped,
        }
        body.update(request.app.get("extra_stats", dict)())
        return web.json_response(body)

    async def connect(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(
            protocols=SUBPROTOCOLS, autoping=False, max_msg_size=MAX_CLIENT_MESSAGE, compress=False
        )
        if not ws.can_prepare(request).ok:
            raise web.HTTPUpgradeRequired(
                text=f"{self.prog} speaks the Foxglove WebSocket protocol: connect Foxglove or Lichtblick to the "
                "ws:// URL it printed\n",
                headers={"Upgrade": "websocket"},
            )
        offered = {p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")}
        if not offered & set(SUBPROTOCOLS):
            raise web.HTTPBadRequest(text=f"offer the subprotocol {' or '.join(SUBPROTOCOLS)}\n")
        await ws.prepare(request)
        peername = request.transport.get_extra_info("peername") if request.transport else None
        peer = f"{peername[0]}:{peername[1]}" if peername else "?"
        client = Client(self, ws, peer, request.transport)
        self.clients.add(client)
        sender = asyncio.create_task(client.send_loop())
        try:
            await ws.send_str(
                json.dumps(
                    {
                        "op": "serverInfo",
                        "name": self.prog,
                        "capabilities": [],
                        "supportedEncodings": [],
                        "metadata": {},
                        "sessionId": self.session,
                    }
                )
            )
            await ws.send_str(json.dumps({"op": "advertise", "channels": [c.advert() for c in self.channels.values()]}))
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    await client.on_text(msg.data)
                elif msg.type == WSMsgType.BINARY:
                    await client.bad_message("binary client messages are not supported (no clientPublish)")
                elif msg.type == WSMsgType.PING:
                    await ws.pong(msg.data)
                elif msg.type == WSMsgType.PONG:
                    client.acknowledge(msg.data)
                elif msg.type == WSMsgType.ERROR:
                    break
        except (ConnectionError, RuntimeError):
            pass  # the client went away
        finally:
            client.leave()
            sender.cancel()
            self.clients.discard(client)
            report = client.report()
            sent = sum(s.sent for s in client.subs.values())
            dropped = sum(s.dropped for s in client.subs.values())
            self.dropped_by_gone += dropped
            extra = f", {client.bad} invalid messages" if client.bad else ""
            self.log.say(
                f"client {report['peer']} left after {time.monotonic() - client.started:.1f} s: "
                f"{sent} messages sent, {dropped} dropped{extra}"
            )
            if not ws.closed and not client.closed:
                try:
                    await asyncio.wait_for(ws.close(), 1.0)
                except (asyncio.TimeoutError, ConnectionError, RuntimeError):
                    client.abort()
        return ws
