# syntax=docker/dockerfile:1
#
# mmgate in a container: `docker build -t mmgate .`, then
#   docker run --rm -p 50051:50051 -p 9464:9464 mmgate
# The image runs the executable's bundle (dist/, which scripts/build-cli.mjs
# writes in the build stage below), as `npm start` does after `npm ci`. It
# carries src/ and gen/ as well: gen/ holds the descriptors reflection
# serves, and bin/mmgate.js falls back to the sources through tsx should the
# bundle ever be older than them (the last stage checks that it is not).
#
# Build arguments:
#   NODE_IMAGE   the Node 20 base (engines: node >= 20.19)
#   WITH_FFMPEG  true (default) installs Debian's ffmpeg, which the media
#                module's video decoder runs (ffprobe and ffmpeg on PATH).
#                false leaves it out (a much smaller image: ffmpeg's
#                libraries are most of its size); images still decode, and a
#                video then fails with "Video decoding is unavailable: ffprobe
#                not found" instead of decoding. Video is
#                on by default because the media module serves it by default.

ARG NODE_IMAGE=node:20-bookworm-slim

# Dependencies: production only. tsx (the TypeScript loader, and esbuild with
# it, which builds the bundle), sharp (prebuilt libvips from
# @img/sharp-linux-x64, glibc) and the rest of "dependencies" are all the
# runtime needs; buf, eslint, mocha and typescript stay out. --ignore-scripts:
# no runtime package needs an install script (sharp ships prebuilt binaries;
# esbuild's postinstall only checks its binary, and package.json's
# allowScripts turns it off anyway); it also skips this package's own
# prepare script, so the build stage runs the bundle's build itself.
FROM ${NODE_IMAGE} AS deps
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund && npm cache clean --force

# The bundle: what `npm ci` builds through the prepare script, from the same
# files (bin/dist.js names them).
FROM deps AS build
COPY tsconfig.json ./
COPY scripts/build-cli.mjs ./scripts/
COPY bin ./bin
COPY gen ./gen
COPY src ./src
RUN node scripts/build-cli.mjs

FROM ${NODE_IMAGE}
ARG WITH_FFMPEG=true
RUN if [ "$WITH_FFMPEG" = "true" ]; then \
      apt-get update \
      && apt-get install -y --no-install-recommends ffmpeg \
      && rm -rf /var/lib/apt/lists/*; \
    fi
ENV NODE_ENV=production
WORKDIR /app
# Everything the process reads at run time: bin/ (the entry point), dist/
# (the bundle it runs), gen/ (descriptors: reflection serves these, so
# proto/ is not needed), package.json (the version), and src/ with gen/'s
# generated messages for the fallback to the sources. Owned by root and
# read-only to the process.
COPY --from=deps /app/node_modules ./node_modules
COPY package.json package-lock.json ./
COPY bin ./bin
COPY gen ./gen
COPY src ./src
COPY --from=build /app/dist ./dist
# The image must run the bundle: fail the build if bin/mmgate.js would find
# it older than the files copied above (a clock ahead on the build host, say).
RUN ["node", "--input-type=module", "-e", "import { isFresh } from './bin/dist.js'; if (!isFresh()) { console.error('dist/ is older than src/, gen/ or package.json: mmgate would run the sources through tsx'); process.exit(1); }"]

# The base image's unprivileged user (uid 1000). The process writes only under
# os.tmpdir(): videos staged for ffmpeg (and tsx's transform cache,
# /tmp/tsx-1000, were it ever to run the sources), so the root filesystem can
# be read-only with /tmp writable.
USER node

EXPOSE 50051 9464

# grpc.health.v1 Check of the whole server: exit 0 while SERVING. It talks to
# the listener the CMD below binds; change both if you move the port.
HEALTHCHECK --interval=15s --timeout=10s --start-period=30s --retries=3 \
  CMD ["node", "bin/mmgate.js", "health", "--addr", "127.0.0.1:50051", "--timeout", "5000"]

# Exec form, node as PID 1: SIGTERM reaches the server, which drains
# (shutdown.graceMs) and exits 0. Never `npm start`: npm does not pass the
# signal on. Configure with -c FILE / MMGATE_CONFIG and MMGATE_* variables;
# these two flags win over both.
CMD ["node", "bin/mmgate.js", "serve", "--listen", "0.0.0.0:50051", "--admin-listen", "0.0.0.0:9464"]
