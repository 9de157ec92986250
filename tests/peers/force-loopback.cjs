// Preload (node -r force-loopback.cjs ...) for test servers that call listen(port) without a
// host: such a call would bind every interface; this makes it bind 127.0.0.1 instead.
// With PORTCULLIS_ANNOUNCE=1 it also prints `LISTENING <port>` on stdout once the first server
// listens (so PORT=0 can be used and the chosen port read back).
'use strict';
const net = require('net');
const listen = net.Server.prototype.listen;
let announced = false;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === 'number' || (typeof args[0] === 'string' && /^\d+$/.test(args[0]))) {
    if (typeof args[1] !== 'string') args.splice(1, 0, '127.0.0.1');
  } else if (args[0] && typeof args[0] === 'object' && args[0].port !== undefined && !args[0].host) {
    args[0] = { ...args[0], host: '127.0.0.1' };
  }
  if (process.env.PORTCULLIS_ANNOUNCE === '1') {
    this.once('listening', () => {
      if (!announced) process.stdout.write(`LISTENING ${this.address().port}\n`);
      announced = true;
    });
  }
  return listen.apply(this, args);
};
