"""The 3-D drawing and file helpers shared by the volume mirrors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rexmle_grade.errors import TaskDataMissingError
from rexmle_tasks.families.synth3d import Ellipsoid, Grid, Pose, image_geometry, tube


def test_a_covering_grid_is_centred_and_large_enough() -> None:
    grid = Grid.covering((10.0, 7.0, 9.0), (2.0, 2.0, 3.0), centre=(1.0, -1.0, 0.0))
    assert grid.size == (5, 4, 3) and grid.shape == (3, 4, 5)
    assert grid.origin == (1.0 - 4.0, -1.0 - 3.0, -3.0)  # half of (n - 1) x spacing below the centre
    assert grid.index_box((0.0, -10.0, -1.0), (2.9, 10.0, 1.0)) == (slice(1, 2), slice(0, 4), slice(2, 3))
    assert grid.index_box((100.0, 0.0, 0.0), (101.0, 1.0, 1.0)) is None


def test_an_ellipsoid_seen_after_a_movement_matches_the_moved_scene() -> None:
    grid = Grid.covering((120.0, 140.0, 100.0), (1.6, 1.6, 5.0), centre=(1.0, 2.0, 3.0))
    shape = Ellipsoid.of((10.0, -5.0, 8.0), (30.0, 12.0, 20.0), 25.0)
    pose = Pose(7.0, (3.0, -2.0, 4.0))
    # by hand: voxel p sees the scene point R(7°) p + shift, tested against the unmoved, turned ellipsoid
    x, y, z = np.broadcast_arrays(*grid.coords())
    theta, alpha = math.radians(7.0), math.radians(25.0)
    sx, sy, sz = math.cos(theta) * x - math.sin(theta) * y + 3.0, math.sin(theta) * x + math.cos(theta) * y - 2.0, z + 4
    dx, dy, dz = sx - 10.0, sy + 5.0, sz - 8.0
    u, v = math.cos(alpha) * dx + math.sin(alpha) * dy, -math.sin(alpha) * dx + math.cos(alpha) * dy
    expected = (u / 30.0) ** 2 + (v / 12.0) ** 2 + (dz / 20.0) ** 2 <= 1.0
    assert expected.sum() > 1000
    assert np.array_equal(shape.seen_by(pose).mask(grid), expected)
    assert np.array_equal(shape.seen_by(Pose(0.0, (0.0, 0.0, 0.0))).mask(grid), shape.mask(grid))


def test_a_tube_holds_the_voxels_within_its_radius_of_the_path() -> None:
    grid = Grid(size=(20, 20, 20), spacing=(1.0, 1.0, 1.0), origin=(0.0, 0.0, 0.0))
    path = np.array([[6.0, 10.0, 10.0], [17.0, 10.0, 10.0], [17.0, 2.0, 10.0]])
    mask = tube(grid, path, [3.0, 3.0, 1.5])
    assert mask[10, 10, 8] and mask[10, 13, 8] and not mask[10, 14, 8]  # 3 mm from the first segment's axis
    assert mask[10, 2, 17] and not mask[10, 2, 19]  # the radius tapers to 1.5 mm at the far end
    assert mask[10, 10, 3] and not mask[10, 10, 2]  # rounded ends: within the radius of the first point
    assert mask.sum() == mask[5:16, :, :].sum()  # nothing drawn beyond radius 3 of the z = 10 plane


def test_an_unreadable_task_file_is_a_data_error(tmp_path) -> None:
    broken = tmp_path / "case.mha"
    broken.write_bytes(b"ObjectType = Image\nNDims = 3\n")
    with pytest.raises(TaskDataMissingError, match=r"case\.mha"):
        image_geometry(broken)
