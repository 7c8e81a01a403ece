import pytest
from hamid.sim.apiserver import ApiServer

@pytest.fixture
async def apiserver():
    async with ApiServer() as s:
        yield s
