"""A real `redis-server` on 127.0.0.1 at a free port, for the shared-limit tests and benchmark: the launcher lives
in prompt_r1.clients.redis_process (a local Ray run starts its store with it too).

    with RedisServer() as redis:
        EnvironmentConfig(rate_store=redis.url)
        redis.stop(); redis.start()  # the same port again: a store lost mid-run and back
"""

from prompt_r1.clients.redis_process import RedisServer, redis_server_binary

__all__ = ["RedisServer", "redis_server_binary"]
