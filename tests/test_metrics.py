"""Metrics from confusion matrices, checked against hand computation."""

import numpy as np
import pytest

from har_models.nn.metrics import accuracy, confusion_matrix, macro_f1, mean_over_clients, summarise, weighted_f1


def test_hand_computed_example():
    y = np.array([0, 0, 0, 1, 1, 2])
    p = np.array([0, 0, 1, 1, 2, 2])
    cm = confusion_matrix(y, p, 3)
    np.testing.assert_array_equal(cm, [[2, 1, 0], [0, 1, 1], [0, 0, 1]])
    assert accuracy(cm) == pytest.approx(4 / 6)
    # F1: class0 2*2/(4+0+1)=0.8, class1 2/(2+1+1)=0.5, class2 2/(2+1+0)=2/3
    assert macro_f1(cm) == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)
    assert weighted_f1(cm) == pytest.approx((3 * 0.8 + 2 * 0.5 + 1 * 2 / 3) / 6)


def test_absent_classes_are_left_out_of_macro_f1():
    cm = confusion_matrix(np.array([0, 0, 1]), np.array([0, 0, 1]), 4)
    assert macro_f1(cm) == 1.0  # classes 2 and 3 occur nowhere


def test_union_metrics_are_the_sum_of_parts_and_client_means_are_unweighted():
    a = confusion_matrix(np.array([0, 1]), np.array([0, 1]), 2)  # 100 %
    b = confusion_matrix(np.array([0, 0, 0, 1]), np.array([1, 1, 1, 1]), 2)  # 25 %
    m = mean_over_clients([a, b])
    assert m["accuracy"] == pytest.approx((1.0 + 0.25) / 2)
    assert m["accuracy_weighted"] == pytest.approx(3 / 6)
    assert summarise(a + b)["accuracy"] == pytest.approx(3 / 6)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        confusion_matrix(np.array([2]), np.array([0]), 2)
    with pytest.raises(ValueError, match="square"):
        accuracy(np.zeros((2, 3)))
    assert np.isnan(accuracy(np.zeros((2, 2))))
